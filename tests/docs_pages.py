"""The documentation as the tests read it: the README and the docs site's pages.

Issue 20 moved the README's reference and how-to sections into ``docs/``. Tests that
keep a documented snippet runnable, a documented command real, or a documented table
complete read the page the text now lives on, through these helpers.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def doc_files() -> list[Path]:
    """README.md and every Markdown page of the docs site (generated pages aside)."""
    pages = [
        path
        for path in sorted(DOCS.rglob("*.md"))
        if "_generated" not in path.parts and "_build" not in path.parts
    ]
    return [ROOT / "README.md", *pages]


def page(relative: str) -> str:
    """The text of one page, e.g. ``"docs/reference/configuration.md"``."""
    return ROOT.joinpath(relative).read_text(encoding="utf-8")


def all_text() -> str:
    """Every documentation file, one after another."""
    return "\n".join(path.read_text(encoding="utf-8") for path in doc_files())


def snippet(name: str) -> str:
    """The fenced block after ``<!-- snippet: NAME ... -->``, wherever it is; there
    must be exactly one in all the documentation."""
    found = re.findall(
        r"<!-- snippet: " + re.escape(name) + r"[ (].*?-->\n```\w*\n(.*?)```",
        all_text(),
        flags=re.DOTALL,
    )
    assert len(found) == 1, f"the docs have {len(found)} snippets named {name!r}"
    return str(found[0])


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of ``text`` (to the next ``## ``)."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
