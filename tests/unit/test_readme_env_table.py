"""Every ``EFFECT_BROKER_*`` variable the code reads is in the docs' one table
(docs/reference/configuration.md; it was the README's before issue 20).

Issue 11: eight settings were read by the code and documented nowhere. The code's
side is every quoted ``"EFFECT_BROKER_..."`` literal in ``config/`` and
``effect_broker/``, plus the pool variables that ``config/capacity.py`` builds from
the role name. The README's side is the first column of the "Configuration" table,
where ``EFFECT_BROKER_X_MIN_SIZE`` / ``_MAX_SIZE`` abbreviates a sibling variable.
"""

from __future__ import annotations

import re
from pathlib import Path

from config import capacity

ROOT = Path(__file__).resolve().parents[2]
_LITERAL = re.compile(r"""["'](EFFECT_BROKER_[A-Z0-9_]+)["']""")
#: A settings attribute read by name, not a variable of the environment.
_SETTING = re.compile(r"""getattr\(settings, ["'](EFFECT_BROKER_[A-Z0-9_]+)["']""")
_BUILT = re.compile(r"""f["'][^"']*EFFECT_BROKER_\{""")
#: The one place a variable name is built, and what it builds.
POOL_PREFIX = "EFFECT_BROKER_{role.upper()}_DB_POOL"
POOL_SUFFIXES = ("_MIN_SIZE", "_MAX_SIZE", "_TIMEOUT")


def read_in_code() -> set[str]:
    names: set[str] = set()
    built: list[str] = []
    for path in [
        *ROOT.joinpath("config").rglob("*.py"),
        *ROOT.joinpath("effect_broker").rglob("*.py"),
    ]:
        text = path.read_text(encoding="utf-8")
        literals = _LITERAL.findall(text)
        settings_only = set(_SETTING.findall(text))
        names.update(
            n for n in literals if n not in settings_only or literals.count(n) > 1
        )
        built += [
            f"{path.relative_to(ROOT)}: {line.strip()}"
            for line in text.splitlines()
            if _BUILT.search(line)
        ]
    # A new computed name must be listed here, or the test cannot see it.
    assert all(POOL_PREFIX in line for line in built), built
    for role in capacity.POOL_DEFAULTS:
        prefix = f"EFFECT_BROKER_{role.upper()}_DB_POOL"
        names.update(prefix + suffix for suffix in POOL_SUFFIXES)
    return names


def configuration_table() -> list[list[str]]:
    text = ROOT.joinpath("docs/reference/configuration.md").read_text(encoding="utf-8")
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.findall(r"`([^`]+)`", row.split("|")[1]) for row in rows]


def documented(name: str, table: list[list[str]]) -> bool:
    """``name`` is in the table: itself, as a sibling suffix (``_MAX_SIZE``), or as
    a prefix read with a variable end (``EFFECT_BROKER_SECRET_<NAME>``)."""
    for names in table:
        if name in names:
            return True
        if name.endswith("_") and any(n.startswith(name + "<") for n in names):
            return True
        full = [n for n in names if n.startswith("EFFECT_BROKER_")]
        for suffix in (n for n in names if n.startswith("_")):
            stem = name.removesuffix(suffix)
            if stem != name and any(f.startswith(stem + "_") for f in full):
                return True
    return False


def test_every_variable_the_code_reads_is_in_the_readme_table() -> None:
    table = configuration_table()
    missing = sorted(n for n in read_in_code() if not documented(n, table))
    assert missing == [], f"add these to docs/reference/configuration.md: {missing}"


def test_the_table_documents_no_variable_the_code_does_not_read() -> None:
    code = read_in_code()
    listed = {
        n.split("<")[0]
        for names in configuration_table()
        for n in names
        if n.startswith("EFFECT_BROKER_")
    }
    assert sorted(listed - code) == []


def test_the_check_sees_a_missing_row() -> None:
    table = [
        row
        for row in configuration_table()
        if "EFFECT_BROKER_JOB_POLL_SECONDS" not in row
    ]
    assert not documented("EFFECT_BROKER_JOB_POLL_SECONDS", table)
    assert documented("EFFECT_BROKER_API_DB_POOL_TIMEOUT", table)
    assert documented("EFFECT_BROKER_MAX_ARGUMENT_DEPTH", table)
    assert not documented("EFFECT_BROKER_API_DB_POOL_MIN_TIMEOUT_X", table)
