"""`--help` lists what exists: every bench mode and dataset, from the registries the code uses,
and every default, from the parsers themselves (issue 33: no hand-kept list that can drift)."""

from __future__ import annotations

import argparse

import pytest

from app import cli
from load_tests import bench, concurrency


def flat(text: str) -> str:
    return " ".join(text.split())


def defaults_shown(parser: argparse.ArgumentParser) -> list[str]:
    """The options whose default the help does not show."""
    text = flat(parser.format_help())
    return [action.dest for action in parser._actions
            if action.default is not argparse.SUPPRESS and action.help
            and f"(default: {action.default})" not in text]


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


@pytest.mark.parametrize("parser", [bench.build_parser(), concurrency.build_parser()],
                         ids=["bench", "concurrency"])
def test_help_shows_every_default(parser: argparse.ArgumentParser) -> None:
    assert defaults_shown(parser) == []


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
