"""`python -m app.distill`: the distillation (`ooo-spec sidecar distill` runs it so). Run from
the repository root, `python -m` puts the root on sys.path, so the dataset loaders it collects
from (load_tests/) import without any path edit."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from app.distill import command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m app.distill",
        description="Collect the main model's committed calls, render them as the sidecar's "
        "slot prompts, train a LoRA adapter on the sidecar model and report held-out "
        "agreement before and after (app/distill/README.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    command.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return command.run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
