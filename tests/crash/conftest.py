"""The crash matrix runs once per session; both crash test modules read its results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict]:
    """``effect-broker demo crash-matrix`` exactly as a user runs it, every cell."""
    folder = tmp_path_factory.mktemp("matrix")
    out, log = folder / "matrix.json", folder / "matrix.log"
    png = folder / "matrix.png"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    # Output to a file, not a pipe: a pipe's reader waits for EOF from every process
    # that inherited it, so one leaked grandchild would hang the test.
    with log.open("w") as sink:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "effect_broker.cli",
                "demo",
                "crash-matrix",
                "--runs",
                "24",
                "--seed",
                "7",
                "--json",
                str(out),
                "--png",
                str(png),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=900,
            check=False,
        )
    data = json.loads(out.read_text()) if out.exists() else {}
    data["png_head"] = png.read_bytes()[:8] if png.exists() else b""
    return result.returncode, log.read_text(errors="replace"), data
