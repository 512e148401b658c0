"""The wheel installs one top-level package (issue 11, item 8).

It used to install `config` and `examples` as top-level packages, which collide with
any other project's in site-packages. They now travel inside `effect_broker` as
`effect_broker/_project/`, and the console script puts that directory on its own path.
This test builds the real wheel and unpacks it beside nothing else; it does not
install the dependencies (the suite's environment has them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("effect_broker-*.whl")
    return built


def test_the_wheel_has_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"effect_broker", wheel.name.split("-py")[0] + ".dist-info"}
    assert "effect_broker/_project/config/settings.py" in names
    assert "effect_broker/_project/examples/crash_matrix/target_service.py" in names
    assert "effect_broker/_project/examples/contracts.toml" in names


def test_the_console_script_finds_the_bundled_project_first(
    wheel: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import sys; sys.path.remove('') if '' in sys.path else None; "
        "import effect_broker.cli as cli; cli.use_bundled_project(); "
        "import config.settings, examples.crash_matrix.target_service as t; "
        "print(config.settings.__file__); print(t.__file__); "
        "import os; print(os.environ['PYTHONPATH'].split(os.pathsep)[0])"
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")},
        "PYTHONPATH": str(site),
        "EFFECT_BROKER_STATE_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    settings_file, target_file, child_path = done.stdout.split()
    bundled = site / "effect_broker" / "_project"
    assert Path(settings_file).is_relative_to(bundled)
    assert Path(target_file).is_relative_to(bundled)
    assert Path(child_path) == bundled  # children import them from there too
