"""The hosted CI workflow (.github/workflows/ci.yml) runs commands that exist.

No hosted runner executes this workflow during development, so these tests are what
keeps it honest: the layers it promises are there, on the interpreters the classifiers
name, and every `run:` line calls a command, path or option this project has.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.command_lines import check_line

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
PYTHONS = ["3.11", "3.12", "3.13"]


def workflow() -> dict[str, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict)
    return loaded


def run_lines() -> list[tuple[str, str]]:
    lines = []
    for job_name, job in workflow()["jobs"].items():
        for step in job["steps"]:
            if "run" in step:
                lines.extend((job_name, line) for line in step["run"].splitlines())
    return lines


def test_the_workflow_has_every_layer_the_project_promises() -> None:
    jobs = workflow()["jobs"]
    assert set(jobs) >= {
        "lint",
        "unit",
        "integration",
        "crash-matrix",
        "package",
        "image",
    }
    # YAML 1.1 reads a bare `on:` key as True.
    triggers = workflow().get("on") or workflow().get(True)
    assert "push" in triggers
    assert "pull_request" in triggers


@pytest.mark.parametrize("job", ["unit", "integration", "crash-matrix"])
def test_the_suite_runs_on_every_supported_interpreter(job: str) -> None:
    matrix = workflow()["jobs"][job]["strategy"]["matrix"]
    assert matrix["python"] == PYTHONS


def test_integration_runs_against_a_postgres_service_through_database_url() -> None:
    job = workflow()["jobs"]["integration"]
    assert "postgres" in job["services"]
    assert job["env"]["DATABASE_URL"].startswith("postgresql://")


def test_the_classifiers_name_exactly_the_interpreters_ci_tests() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = sorted(
        c.rsplit(" ", 1)[1]
        for c in project["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    )
    assert named == PYTHONS


@pytest.mark.parametrize(
    ("job", "line"), run_lines(), ids=[f"{j}:{line[:40]}" for j, line in run_lines()]
)
def test_every_command_the_workflow_runs_exists(job: str, line: str) -> None:
    check_line(line)


def test_the_checker_refuses_a_command_that_does_not_exist() -> None:
    # The parametrised test above is only worth something if the checker can fail.
    for bad in (
        "effect-broker no-such-command",
        "effect-broker demo crash-matrix --no-such-flag",
        "pytest tests/no_such_dir",
        "python -m no_such_module_here",
        "frobnicate --now",
    ):
        with pytest.raises(AssertionError):
            check_line(bad)


def test_ci_run_runs_the_readme_test_command_verbatim() -> None:
    # The README promises that `.ci/run` runs its Quick start test command exactly.
    quick_start = (ROOT / "README.md").read_text().split("## Quick start", 1)[1]
    block = quick_start.split("```bash\n", 1)[1].split("```", 1)[0]
    [command] = [line for line in block.splitlines() if line.endswith("/pytest")]
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in script
    # And each pass ends with the slowest tests, so the next round sees where time goes.
    assert 'export PYTEST_ADDOPTS="--durations=25"' in script


def test_the_dev_extra_installs_what_would_otherwise_skip_tests() -> None:
    # Tests that import an extra skip without it; CI installs only `.[dev]`, so a
    # missing extra hides its tests in every run (the Stripe adapter's did).
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {
        "effect-broker[stripe]",
        "effect-broker[runtimes]",
        "effect-broker[demo-agent]",
        "effect-broker[otel]",
    } <= set(extras["dev"])
    assert any(line.startswith("pytest-xdist") for line in extras["dev"])


def test_the_readme_skip_count_is_the_sum_of_its_reasons() -> None:
    # The development page's "Tests" counts what a run skips and breaks it down by
    # reason; the parts must add up to the count (recount from the `SKIPPED [n]`
    # lines of `pytest -ra`). It was the README's section before issue 20.
    page = ROOT / "docs" / "reference" / "development.md"
    text = " ".join(page.read_text().split("## Tests", 1)[1].split())
    match = re.search(
        r"What it skips otherwise \((\d+)\), and why: (\d+) adapter-conformance checks"
        r" (.*?) the live Stripe test .*? and the two live model tests",
        text,
    )
    assert match, "docs 'Tests' no longer states its skip count and reasons"
    total, conformance, reasons = int(match[1]), int(match[2]), match[3]
    per_reason = [int(n) for n in re.findall(r"\((\d+)\)", reasons)]
    assert sum(per_reason) == conformance, per_reason
    assert total == conformance + 1 + 2  # + the live Stripe test + two live models
