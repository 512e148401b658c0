"""Every ``effect-broker <command>`` the README or a docs page tells a user to run
exists.

Issue 11: a new user could not run the broker from the README alone. The "Run it"
steps name commands in order; a renamed or missing command must fail here, not in a
user's terminal.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.core.management import get_commands

from tests import docs_pages

ROOT = Path(__file__).resolve().parents[2]
_COMMAND = re.compile(r"(?:^|[\s(;&|])effect-broker\s+([a-z][a-z_-]*)")


def readme_commands() -> set[str]:
    text = docs_pages.all_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return {m.group(1) for block in blocks for m in _COMMAND.finditer(block)}


def test_every_command_in_the_readme_exists() -> None:
    missing = sorted(readme_commands() - set(get_commands()))
    assert missing == []


def test_run_it_names_the_whole_path_in_order() -> None:
    run_it = docs_pages.page("docs/tutorial/first-hour.md")
    steps = [
        "effect-broker contracts validate",
        "effect-broker migrate",
        "effect-broker createsuperuser",
        "effect-broker tenants create",
        "effect-broker serve",
        "effect-broker worker",
        "curl -s -X POST localhost:8000/v1/effects",
        "/admin/",
        "/resolve",
    ]
    positions = [run_it.find(step) for step in steps]
    assert -1 not in positions, dict(zip(steps, positions, strict=True))
    assert positions == sorted(positions)
