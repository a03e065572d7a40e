"""The documentation hangs together: docs/index.md lists every page, relative links lead somewhere, the Markdown
renders (fences closed, table rows as wide as their header), and the README stays a page a user reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((ROOT / "examples").glob("*/README.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 250


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link or a table inside a block is code, not Markdown)."""
    return re.sub(r"^\s*```.*?^\s*```[^\n]*$", "", text, flags=re.M | re.S)


def cell_count(row: str) -> int:
    """The cells of a Markdown table row (an escaped ``\\|`` is a character inside a cell)."""
    return len(re.split(r"(?<!\\)\|", row.strip())) - 2


def test_the_index_lists_every_page_once():
    index = (DOCS / "index.md").read_text()
    listed = [target for target in LINK.findall(index) if not target.startswith("..")]
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md")
    assert sorted(set(listed)) == sorted(listed), "docs/index.md lists a page twice"
    assert not set(pages) - set(listed), f"docs/index.md does not list {sorted(set(pages) - set(listed))}"


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # a web address, or a heading of the same page
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_markdown_renders():
    problems = []
    for page in PAGES:
        text = page.read_text()
        name = page.relative_to(ROOT)
        if len(re.findall(r"^\s*```", text, re.M)) % 2:
            problems.append(f"{name}: a code fence is not closed")
        if len(re.findall(r"^# ", prose(text), re.M)) != 1:
            problems.append(f"{name}: not exactly one top-level heading")
        width = None  # the cells of the current table's header; None outside a table
        for line in prose(text).splitlines():
            if not line.startswith("|"):
                width = None
                continue
            cells = cell_count(line)
            if width is None:
                width = cells
            elif cells != width:
                problems.append(f"{name}: a table row has {cells} cells, its header {width}: {line[:60]}")
    assert not problems, "\n".join(problems)


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; it is the page a new user reads: move details to a page of docs/ "
        "(listed in docs/index.md) and link it"
    )


def test_cell_count():
    """Cells counted as a renderer counts them (else test_markdown_renders could not fail)."""
    assert cell_count("| a | b |") == 2 and cell_count("| 1 | 2 | 3 |") == 3 and cell_count("|---|---|") == 2
    assert cell_count(r"| a \| b | c |") == 2
