"""Which tests share one xdist worker (tests/conftest.py): the ones that must, do.

The crash matrix restarts and stops an embedded server of its own under the checkout
and ``effect-broker dev`` writes under the checkout too: two such runs at the same
moment on two workers would break each other. A new test file that starts either must
land in its group, or the suite turns flaky only when run in parallel. A file whose
matrix runs get a state directory of their own (``EFFECT_BROKER_STATE_DIR``, so a
server of their own) may instead run whole on one worker of its choosing.
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
#: How a file gives its matrix runs a state directory (and so a server) of their own.
OWN_STATE = re.compile(r"EFFECT_BROKER_STATE_DIR=")


def test_every_test_file_that_starts_a_shared_run_is_in_its_group() -> None:
    found = {group: [] for group in STARTS}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        relative = path.relative_to(ROOT).as_posix()
        for group, pattern in STARTS.items():
            if pattern.search(text) and relative != "tests/unit/test_xdist_groups.py":
                found[group].append(relative)
                where = xdist_group_of(f"{relative}::test")
                own_state = group == "crash-matrix" and OWN_STATE.search(text)
                assert where == (relative if own_state else group), relative
    # The scan sees the files it is meant for (a pattern that matches nothing checks
    # nothing).
    assert "tests/crash/conftest.py" in found["crash-matrix"]
    assert "tests/acceptance/test_crash_matrix_cli.py" in found["crash-matrix"]
    assert xdist_group_of("tests/crash/test_crash_matrix.py::test") == "crash-matrix"
    assert found["dev"] == ["tests/acceptance/test_dev_command.py"]


def test_other_tests_are_handed_out_one_by_one() -> None:
    assert xdist_group_of("tests/unit/test_keys.py::test_x") is None
    assert xdist_group_of("tests/integration/test_api.py::test_x[a::b]") is None
    # A module kept whole is its own group, named by its path.
    path = "tests/acceptance/test_effects_cli.py"
    assert xdist_group_of(f"{path}::test_x") == path
