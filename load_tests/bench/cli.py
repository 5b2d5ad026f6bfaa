"""`python -m load_tests.bench`: the flags, and `--help` listing every mode and dataset from
the registries (`MODES`, `DATASETS`) with every default."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence

from load_tests.bench.command import DEFAULT_BASE_URL, BenchError, run_command
from load_tests.bench.datasets import AUTO_SET, BFCL_GROUPS, DATASETS
from load_tests.bench.modes import BASELINE, MODES


def modes_help() -> str:
    """The `--help` list of modes, from `MODES` (a registered mode shows up by itself)."""
    width = max(len(name) for name in MODES)
    lines = [f"modes (--modes, comma-separated; `{BASELINE}` is the baseline):"]
    for mode in MODES.values():
        only = f" [{', '.join(sorted(mode.sources))} only]" if mode.sources is not None else ""
        lines += _wrap(f"{mode.name:<{width}}  {mode.description}{only}", " " * (width + 4))
    return "\n".join(lines)


def _wrap(text: str, indent: str, first: str = "  ") -> list[str]:
    # Names hold hyphens (`bfcl-auto`): never split them.
    return textwrap.wrap(text, 96, initial_indent=first, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def datasets_help() -> str:
    """The `--help` list of datasets, from `DATASETS`, `BFCL_GROUPS` and `AUTO_SET`."""
    lines = _wrap("datasets (--dataset, comma-separated `source:category`; an item without a "
                  "source takes the one before it):", "  ", first="")
    for source in DATASETS.values():
        label = f"{source.name}:<category>" if source.categories else source.name
        lines += _wrap(f"{label}  {source.description}", "      ")
        if source.categories:
            lines += _wrap("categories: " + ", ".join(source.categories), "        ",
                           first="      ")
    shorthands = [f"bfcl:{name} = {', '.join(group)}" for name, group in BFCL_GROUPS.items()]
    shorthands.append(f"auto = {', '.join(AUTO_SET)}")
    lines += _wrap("shorthands: " + "; ".join(shorthands), "    ")
    return "\n".join(lines)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults from the parser itself; the mode and dataset lists kept as laid out."""


def build_parser() -> argparse.ArgumentParser:
    """The CLI; its help lists every mode and dataset from the registries the code uses."""
    parser = argparse.ArgumentParser(
        prog="python -m load_tests.bench",
        formatter_class=_HelpFormatter,
        description=textwrap.fill(
            "Send every case of a dataset once per mode to an OpenAI-compatible ooo-spec "
            "server (interleaved case by case, mode order rotated per case), then print "
            "per-mode statistics and ratios against `plain`, and write every request's numbers "
            "(JSON) and a latency plot (PNG) under --out. With --start the app is started from "
            "--config first and stopped at the end.", 96),
        epilog=f"{modes_help()}\n\n{datasets_help()}",
    )
    parser.add_argument("--dataset", default="bfcl:simple_python",
                        help="comma-separated datasets (listed below)")
    parser.add_argument("--limit", type=int, default=None,
                        help="first N cases of each category, or N conversations of a "
                        "bfcl-multi category (None: all)")
    parser.add_argument("--conversations", type=int, default=None,
                        help="first N conversations of each bfcl-multi category (None: "
                        "--limit)")
    parser.add_argument("--modes", default="plain,ooo",
                        help="comma-separated modes (listed below); `ngram` and `suffix` need "
                        "their engines on the server (configs/bench.yaml)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="warm-up requests per mode, left out of the statistics")
    parser.add_argument("--base-url", default=None,
                        help=f"server to benchmark (None: {DEFAULT_BASE_URL}, or the port of "
                        "--port); ignored with --start")
    parser.add_argument("--start", action="store_true",
                        help="start the app from --config (local Ray) and stop it at the end")
    parser.add_argument("--config", default="configs/local.yaml",
                        help="Ray Serve config file for --start")
    parser.add_argument("--port", type=int, default=None,
                        help="HTTP port: overrides the config's port with --start, else the "
                        "port of the default base URL")
    parser.add_argument("--model", default=None,
                        help="model name to send (None: the first one in /v1/models)")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens per request")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="per-request timeout in seconds")
    parser.add_argument("--max-duration", type=float, default=3600.0,
                        help="stop sending requests after this many seconds")
    parser.add_argument("--max-errors", type=int, default=10,
                        help="stop after this many failed requests in a row")
    parser.add_argument("--slow-tool-ms", type=float, default=None,
                        help="with --start: latency of the bench tool slow_lookup "
                        "(load_tests/bench_tools.py, OOO_SPEC_SLOW_TOOL_MS; None: its own 500)")
    parser.add_argument("--out", default="bench_out/",
                        help="folder for the JSON records and the PNG plot")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m load_tests.bench` (and `ooo-spec bench`, which runs it): the exit code."""
    args = build_parser().parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        return run_command(args, say)
    except BenchError as error:
        print(f"bench: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
