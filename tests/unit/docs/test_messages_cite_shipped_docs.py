"""What the broker tells a user cites only documents that ship with it (issue 20).

Error messages cited "spec rule 6/7", but the spec is not in the repository; a user
cannot look it up. Every string the package can show (docstrings and comments aside)
must not cite it, and every ``docs/...md`` page a string names must exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
_DOC_PATH = re.compile(r"docs/[\w./-]+\.md")


def shown_strings() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(ROOT.joinpath("effect_broker").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            )
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
            ):
                found.append((str(path.relative_to(ROOT)), node.lineno, node.value))
    return found


def test_no_message_cites_the_unshipped_spec() -> None:
    citing = [(f, n) for f, n, text in shown_strings() if "spec rule" in text]
    assert citing == []


def test_every_docs_page_a_message_names_exists() -> None:
    missing = sorted(
        {
            (f, page)
            for f, _n, text in shown_strings()
            for page in _DOC_PATH.findall(text)
            if not ROOT.joinpath(page).is_file()
        }
    )
    assert missing == []
