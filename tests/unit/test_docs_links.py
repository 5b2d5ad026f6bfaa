"""Every relative link in the user-facing Markdown (README.md, docs/*.md, app/distill/README.md)
points to a file or folder that exists, and every `#anchor` to a heading of its target."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "app" / "distill" / "README.md",
                *(ROOT / "docs").glob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def prose(markdown: str) -> str:
    """The Markdown without fenced code blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", markdown))


def links(markdown: str) -> list[str]:
    return LINK.findall(prose(markdown))


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code and emphasis marks and punctuation
    other than `-` and `_` dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", markdown))}


def broken_links(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    problems = []
    for target in links(text):
        if not is_relative(target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(
                resolved.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_the_pages_have_links_to_check() -> None:
    # Guards the pattern itself: a LINK that matched nothing would pass every page.
    assert len(links((ROOT / "README.md").read_text(encoding="utf-8"))) >= 5


def test_a_missing_file_and_a_missing_heading_are_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A section (2026)\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-section-2026) [ok](#here) [web](https://example.com)\n"
        "[gone](missing.md) [no heading](other.md#nowhere) `[code](skipped.md)`\n"
        "```\n[fenced](skipped-too.md)\n```\n# Here\n",
        encoding="utf-8")
    assert broken_links(page) == ["missing.md: no such file",
                                  "other.md#nowhere: no heading #nowhere"]


def test_slug_follows_github() -> None:
    assert slug("Under load, before the CPU defaults (2026-12-01)") == (
        "under-load-before-the-cpu-defaults-2026-12-01")
    assert slug("`tool_choice: auto`") == "tool_choice-auto"
