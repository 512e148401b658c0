"""``effect-broker dev`` as a new user runs it: one command, a printed curl that works
as printed, Ctrl-C that leaves nothing behind (issue 11, spec "MVP done")."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from effect_broker import embedded_pg
from examples.crash_matrix.workers import ROOT, wait_until
from tests.acceptance.outage_stack import free_port

pytestmark = pytest.mark.slow


class Dev:
    """One ``effect-broker dev`` process, its output in a file."""

    def __init__(self, project_dir: Path, log: Path) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("EFFECT_BROKER_") and k != "DATABASE_URL"
        }
        # Its own embedded server: dev starts it, and stops it again.
        env.update(EFFECT_BROKER_PROJECT_DIR=str(project_dir), PYTHONUNBUFFERED="1")
        self.log = log
        self.port = free_port()
        with log.open("wb") as sink:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "effect_broker.cli",
                    "dev",
                    "--port",
                    str(self.port),
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def printed_curl(self) -> str:
        """The curl line dev printed, once it is ready."""

        def ready() -> str | None:
            assert self.process.poll() is None, self.text()
            match = re.search(r"^  (curl .*)$", self.text(), re.MULTILINE)
            return match.group(1) if match else None

        return wait_until(ready, timeout=180, what="dev to be ready")

    def children(self) -> set[int]:
        """Pids whose parent is dev."""
        found = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
                if ppid == self.process.pid:
                    found.add(int(entry.name))
        return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def run_as_httpx(curl: str) -> httpx.Response:
    """Send what the printed ``curl -X POST URL -H ... -d BODY`` line sends."""
    words = shlex.split(curl)
    assert words[:4] == ["curl", "-sS", "-X", "POST"], words
    url, rest = words[4], words[5:]
    headers, body = {}, ""
    for flag, value in zip(rest[::2], rest[1::2], strict=True):
        if flag == "-H":
            name, _, text = value.partition(": ")
            headers[name] = text
        else:
            assert flag == "-d", flag
            body = value
    return httpx.post(url, headers=headers, content=body, timeout=30, trust_env=False)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    project = tmp_path / "dev-project"
    project.mkdir()
    try:
        yield project
    finally:
        if embedded_pg.status(project) is not None:
            embedded_pg.stop(project, mode="immediate")
        # Its state lives under /tmp; unix-socket mode names it as the host.
        state = embedded_pg.connection_settings(project, tcp=False)["host"]
        shutil.rmtree(str(state), ignore_errors=True)


def test_dev_runs_the_printed_curl_to_success_and_ctrl_c_stops_everything(
    project: Path, tmp_path: Path
) -> None:
    # Given `effect-broker dev` on a fresh machine (no database running)
    dev = Dev(project, tmp_path / "dev.log")
    try:
        curl = dev.printed_curl()
        children = dev.children()
        assert len(children) == 3, dev.text()  # target, API, worker
        assert "API key (shown once): eb_" in dev.text()
        # When the printed curl is sent
        answer = run_as_httpx(curl)
        assert answer.status_code == 202, answer.text
        effect_id = answer.json()["effect_id"]
        auth = {"Authorization": shlex.split(curl)[6].partition(": ")[2]}

        # Then the effect succeeds
        def succeeded() -> bool:
            got = httpx.get(
                f"http://127.0.0.1:{dev.port}/v1/effects/{effect_id}",
                headers=auth,
                timeout=10,
                trust_env=False,
            )
            return got.json()["status"] == "succeeded"

        wait_until(succeeded, timeout=60, what="the charge to succeed")
        # And Ctrl-C stops every child and the database it started, exit code 0
        dev.process.send_signal(signal.SIGINT)
        assert dev.process.wait(timeout=90) == 0, dev.text()
        assert [pid for pid in children if alive(pid)] == []
        assert embedded_pg.status(project) is None
        assert "Traceback" not in dev.text()
    finally:
        if dev.process.poll() is None:
            dev.process.kill()


def test_a_second_dev_keeps_the_key_secret_and_a_dead_child_stops_it_with_exit_1(
    project: Path, tmp_path: Path
) -> None:
    first = Dev(project, tmp_path / "first.log")
    try:
        first.printed_curl()
        key = re.search(r"API key \(shown once\): (\S+)", first.text())
        assert key, first.text()
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=90) == 0, first.text()
        # Given dev started again on the same database
        second = Dev(project, tmp_path / "second.log")
        curl = second.printed_curl()
        # Then it does not print the key again, and its curl works with the key in
        # EB_API_KEY, as it says
        text = second.text()
        assert "tenant 'dev' exists" in text
        assert "effect-broker tenants rotate-key dev" in text
        assert "shown once" not in text
        assert '"Authorization: Bearer $EB_API_KEY"' in curl
        sent = subprocess.run(
            ["bash", "-c", curl],
            env={**os.environ, "EB_API_KEY": key.group(1)},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert '"status"' in sent.stdout, (sent.stdout, sent.stderr)
        # When its worker dies
        children = second.children()
        worker = int(re.search(r"worker started \(pid (\d+)\)", text).group(1))  # type: ignore[union-attr]
        assert worker in children
        os.kill(worker, signal.SIGKILL)
        # Then dev says so, stops the rest and exits 1
        assert second.process.wait(timeout=90) == 1, second.text()
        assert "the worker exited on its own (exit code -9)" in second.text()
        assert [pid for pid in children if alive(pid)] == []
    finally:
        for dev in (first, locals().get("second")):
            if isinstance(dev, Dev) and dev.process.poll() is None:
                dev.process.kill()
