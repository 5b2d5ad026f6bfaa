"""`--help` lists what exists: every bench mode and dataset, from the registries the code uses,
and every default, from the parsers themselves (issue 33: no hand-kept list that can drift)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

import load_tests
from app import cli
from load_tests import bench, concurrency


def flat(text: str) -> str:
    """One line: argparse wraps lines, also right after a hyphen (`configs/gpu-` + newline)."""
    return " ".join(re.sub(r"-\n\s+", "-", text).split())


def defaults_shown(parser: argparse.ArgumentParser) -> list[str]:
    """The options the help does not describe with their default (`--help` itself aside, and
    hidden ones)."""
    # Without any whitespace: argparse wraps long defaults anywhere, even inside a word.
    text = "".join(parser.format_help().split())
    return [action.dest for action in parser._actions
            if action.option_strings and not isinstance(action, argparse._HelpAction)
            and action.help is not argparse.SUPPRESS
            and not (action.help and "".join(f"(default: {action.default})".split()) in text)]


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def parser_of(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser a command's `main` builds, stopped where it would parse."""
    def built(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Built(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", built)
    with pytest.raises(_Built) as caught:
        module.main(*([[]] if inspect.signature(module.main).parameters else []))
    return caught.value.parser


# Every command of load_tests/ (a module with an argparse CLI, or a package with a `__main__`)
# and the distillation's.
LOAD_TESTS = Path(load_tests.__file__).parent
COMMANDS = sorted(
    [name for name in (f"load_tests.{p.stem}" for p in LOAD_TESTS.glob("*.py"))
     if "argparse" in Path(importlib.util.find_spec(name).origin or "").read_text(encoding="utf-8")]
    + [f"load_tests.{p.parent.name}" for p in LOAD_TESTS.glob("*/__main__.py")]
) + ["app.distill.__main__"]


def listed(help_text: str, name: str) -> bool:
    """`name` starts an entry of the help's lists (a mode's line, a dataset's label)."""
    return any(line.startswith((f"  {name} ", f"  {name}:<category>"))
               for line in help_text.splitlines())


def test_bench_help_lists_every_mode_and_dataset_source() -> None:
    text = bench.build_parser().format_help()
    assert [m for m in bench.MODES if not listed(text, m)] == []
    assert [d for d in bench.DATASETS if not listed(text, d)] == []
    categories = {c for d in bench.DATASETS.values() for c in d.categories}
    assert [c for c in sorted(categories) if c not in flat(text)] == []
    assert "bfcl:core" in text and "auto =" in text  # the shorthands


def test_a_registered_mode_or_dataset_shows_up_in_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """Help is built from the registries: a new mode or dataset needs no help edit."""
    monkeypatch.setitem(bench.MODES, "probe-mode",
                        bench.Mode("probe-mode", {}, "a mode only this test registers"))
    monkeypatch.setitem(bench.DATASETS, "probe-set",
                        bench.DatasetSource("probe-set", "a set only this test registers",
                                            ("probe_category",)))
    text = bench.build_parser().format_help()
    assert listed(text, "probe-mode") and listed(text, "probe-set")
    assert "probe_category" in text
    assert bench.parse_dataset_spec("probe-set:probe_category")[0].source == "probe-set"


def test_every_listed_mode_and_dataset_parses() -> None:
    """What help lists is what `--modes` and `--dataset` accept."""
    assert [m.name for m in bench.parse_modes(",".join(bench.MODES))] == list(bench.MODES)
    for source in bench.DATASETS.values():
        spec = f"{source.name}:{source.categories[0]}" if source.categories else source.name
        assert bench.parse_dataset_spec(spec)[0].source == source.name


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_describes_every_option_with_its_default(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert defaults_shown(parser_of(importlib.import_module(name), monkeypatch)) == []


def test_the_commands_are_found() -> None:
    assert {"load_tests.bench", "load_tests.concurrency", "load_tests.soak"} <= set(COMMANDS)


def test_concurrency_help_lists_its_modes_and_categories() -> None:
    text = flat(concurrency.build_parser().format_help())
    assert all(mode in text for mode in concurrency.MODES)
    assert all(category in text for category in bench.DATASETS["bfcl"].categories)


def test_ooo_spec_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert [name for name in commands.choices if name not in text] == []
