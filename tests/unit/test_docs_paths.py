"""Every repository path the docs and the READMEs name exists: `app/x/y.py`, `tests/unit/...`,
`configs/...` from the repository root (in prose, code spans and diagrams), and a folder
README's bare file names (`service.py`, `tool_formats/`) in that folder; a module may be named
without `.py`. Moving a file without its docs fails here (links: test_docs_links.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("app", "deployments", "tests", "load_tests", "docs", "configs", "k8s", "scripts")
SKIP_DIRS = {".venv", ".git", "node_modules", "bench_out"}
# A path from the root: one of the top folders, then path characters; a trailing `:line`,
# `::test` or `(...)` is not part of it.
ROOT_PATH = re.compile(rf"^(?:{'|'.join(TOPS)})/[\w./-]*$")
# A bare file or folder name in a folder README's table: `name.py`, `name/`.
BARE = re.compile(r"^[\w-]+(?:\.(?:py|md|yaml|yml|json|sh|txt)|/)$")
ANY_PATH = re.compile(rf"(?<![\w/.~$<{{-])((?:{'|'.join(TOPS)})/[\w./-]*[\w/])(?![\w*<{{$-])")
TABLE_FIRST_CELL = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.MULTILINE)


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for top in TOPS:
        found += sorted(p for p in (ROOT / top).rglob("README.md")
                        if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts))
    return list(dict.fromkeys(found))


def root_paths(markdown: str) -> set[str]:
    """Paths from the root named anywhere (code spans, code blocks and diagrams, prose), with a
    `:line` or `::name` suffix cut off; not the tail of a longer path or address."""
    out = set()
    for match in ANY_PATH.finditer(markdown):
        word = re.split(r"::|:(?=\d)", match.group(1))[0].rstrip(".")
        if ROOT_PATH.match(word):
            out.add(word)
    return out


def table_names(markdown: str) -> set[str]:
    """Bare names in the first column of a README's tables (the folder's own files)."""
    return {name for name in TABLE_FIRST_CELL.findall(markdown) if BARE.match(name)}


def missing(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    # A module named without `.py` (`app/config`) counts as its file.
    problems = [p for p in sorted(root_paths(text))
                if not (ROOT / p).exists() and not (ROOT / f"{p}.py").exists()]
    if page.name == "README.md" and page.parent != ROOT:
        problems += [n for n in sorted(table_names(text)) if not (page.parent / n).exists()]
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_exist(page: Path) -> None:
    assert missing(page) == []


def test_a_moved_file_is_caught(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("| `here.py` | x |\n| `gone.py` | y |\n\nSee `app/engine/nowhere.py:12`"
                      " and `app/config.py` and `tests/unit/test_x.py::test_y`.\n")
    (tmp_path / "here.py").write_text("")
    assert table_names(readme.read_text()) == {"here.py", "gone.py"}
    assert root_paths(readme.read_text()) == {"app/engine/nowhere.py", "app/config.py",
                                               "tests/unit/test_x.py"}
    assert missing(readme) == ["app/engine/nowhere.py", "tests/unit/test_x.py", "gone.py"]
