"""Which tests share one xdist worker (tests/conftest.py): the ones that must, do.

The crash matrix restarts and stops an embedded server of its own under the checkout
and ``effect-broker dev`` writes under the checkout too: two such runs at the same
moment on two workers would break each other. A new test file that starts either must
land in its group, or the suite turns flaky only when run in parallel.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import xdist_group_of

ROOT = Path(__file__).resolve().parents[2]

#: What starts a run of each group's shared thing, as test code spells it.
STARTS = {
    "crash-matrix": re.compile(r'"demo",\s*"crash-matrix"|run_matrix\(|open_rig\('),
    "dev": re.compile(r'"effect_broker\.cli",\s*"dev"'),
}


def test_every_test_file_that_starts_a_shared_run_is_in_its_group() -> None:
    found = {group: [] for group in STARTS}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        relative = path.relative_to(ROOT).as_posix()
        for group, pattern in STARTS.items():
            if pattern.search(text) and relative != "tests/unit/test_xdist_groups.py":
                found[group].append(relative)
                assert xdist_group_of(f"{relative}::test") == group, relative
    # The scan sees the files it is meant for (a pattern that matches nothing checks
    # nothing).
    assert "tests/crash/conftest.py" in found["crash-matrix"]
    assert "tests/acceptance/test_crash_matrix_cli.py" in found["crash-matrix"]
    assert found["dev"] == ["tests/acceptance/test_dev_command.py"]


def test_other_tests_are_handed_out_one_by_one() -> None:
    assert xdist_group_of("tests/unit/test_keys.py::test_x") is None
    assert xdist_group_of("tests/integration/test_api.py::test_x[a::b]") is None
    # A module kept whole is its own group, named by its path.
    path = "tests/acceptance/test_effects_cli.py"
    assert xdist_group_of(f"{path}::test_x") == path
