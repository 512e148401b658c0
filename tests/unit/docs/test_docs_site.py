"""The docs site builds strictly, and the README is a front door into it (issue 20).

``sphinx-build -W -n`` turns every warning into an error: a broken link, a link to a
heading that does not exist, a page missing from every table of contents, a generated
reference that no longer imports. The README stays short and every link in it
resolves, since GitHub, not Sphinx, renders it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_pages import ROOT, page, section

_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.slow
def test_the_docs_site_builds_with_no_warning(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-n",
            "-q",
            "-b",
            "html",
            str(ROOT / "docs"),
            str(tmp_path / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    assert (tmp_path / "html" / "reference" / "errors.html").is_file()
    assert (tmp_path / "html" / "openapi.json").is_file()


def test_the_readme_is_a_front_door_of_at_most_300_lines() -> None:
    lines = page("README.md").splitlines()
    assert len(lines) <= 300, len(lines)


def test_quick_start_holds_exactly_the_two_commands() -> None:
    quick = section(page("README.md"), "Quick start")
    block = re.search(r"```bash\n(.*?)```", quick, re.S)
    assert block is not None
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    install = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && "
    assert commands == [
        install + ".venv/bin/effect-broker demo crash-matrix",
        install + ".venv/bin/pytest",
    ]
    # (.ci/run runs the second verbatim: tests/unit/test_ci_workflow.py)


def test_every_relative_link_of_the_readme_resolves() -> None:
    targets = [t for t in _LINK.findall(page("README.md")) if "://" not in t]
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []
