"""The README quotes measurements only from docs/benchmarks.md, the page that gives each one's
command, machine, date and commit: every ratio, percentage, time in ms and small float the
README names, and every cell of its results table, appears on that page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

# What reads as a measurement: 2.93x, 100%, 3,111 ms, 4e-5.
MEASUREMENT = re.compile(
    r"(?<![\w.])(\d[\d,]*(?:\.\d+)?x|\d+(?:\.\d+)?%|\d[\d,]*(?:\.\d+)? ?ms|\d+e-\d+)(?![\w])")
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:x|%)?(?![\w])")


def section(markdown: str, heading: str) -> str:
    text = "\n" + markdown
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def table_cells(markdown: str) -> list[str]:
    return [cell.strip() for line in markdown.splitlines() if line.startswith("|")
            for cell in line.strip("|").split("|")]


def quoted_measurements(readme: str) -> set[str]:
    found = set(MEASUREMENT.findall(readme))
    for cell in table_cells(section(readme, "Current results")):
        found.update(NUMBER.findall(cell))
    return found


def missing_from(page: str, measurements: set[str]) -> list[str]:
    numbers_on_page = set(MEASUREMENT.findall(page)) | set(NUMBER.findall(page))
    return sorted(m for m in measurements if m not in numbers_on_page)


def test_every_measurement_in_the_readme_is_on_the_benchmarks_page() -> None:
    readme = README.read_text(encoding="utf-8")
    measurements = quoted_measurements(readme)
    assert len(measurements) >= 10  # the patterns still find the results table
    assert missing_from(BENCHMARKS.read_text(encoding="utf-8"), measurements) == []


def test_a_number_not_on_the_page_is_reported() -> None:
    readme = ("## Current results\n\n| | plain | ooo |\n|---|---|---|\n| passes | 44 | 13 |\n\n"
              "## Next\n\nooo was 2.93x faster, 1.61x under load, 4e-5 apart, 99% identical.\n")
    page = "passes 44 and 15; 2.93x fewer; 4e-5; 100% identical"
    assert missing_from(page, quoted_measurements(readme)) == ["1.61x", "13", "99%"]
