"""The broker through PgBouncer (issue 25 item 4): the API behind a transaction-mode
pool, a worker behind a session-mode pool, one PgBouncer (Debian's package) that the
test starts on a free port in front of the test's PostgreSQL.

What transaction pooling needs, and this test sets the way docs/scaling.md says:

* ``EFFECT_BROKER_DB_PREPARED_STATEMENTS=off`` for the API: PgBouncer before 1.21
  keeps no prepared statement, and a statement prepared on one server connection
  would later run on another;
* ``EFFECT_BROKER_LISTEN_DATABASE_URL`` pointing at PostgreSQL itself: a LISTEN
  through a transaction pool lasts as long as its statement, so the long-poll's
  listener connects directly;
* ``ignore_startup_parameters = options``: PgBouncer refuses libpq's ``options``
  startup parameter, which carries the session timeouts (config/database.py); behind
  it they are set on the database instead (``ALTER DATABASE ... SET``).

A worker's pool is in session mode: procrastinate LISTENs and the broker prepares its
statements there, both of which need a session.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from config.database import url_from_settings
from examples.bench.environment import SIMULATED_CONTRACT, SIMULATED_TOOL
from tests.acceptance.test_api_server import ROOT, socket_port

PGBOUNCER = shutil.which("pgbouncer") or shutil.which("/usr/sbin/pgbouncer")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PGBOUNCER is None,
        reason="pgbouncer is not installed (Debian: apt-get install pgbouncer; "
        ".ci/run installs it where it can)",
    ),
]

#: What the session timeouts of config/database.py become behind PgBouncer.
DATABASE_SETTINGS = {
    "lock_timeout": "5s",
    "idle_in_transaction_session_timeout": "30s",
    "statement_timeout": "600s",
}
TENANT = """
from effect_broker.services.tenants import create_tenant
print("API_KEY=" + create_tenant("through-pgbouncer")[1])
"""


@dataclass
class Bouncer:
    """A running PgBouncer with one transaction and one session pool."""

    direct_url: str
    transaction_url: str
    session_url: str
    log: Path


def _run_cli(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _env(url: str, contracts: Path, master_key: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    return {
        **env,
        "DATABASE_URL": url,
        "EFFECT_BROKER_CONTRACTS": str(contracts),
        "EFFECT_BROKER_MASTER_KEY": master_key,
        "DEBUG": "0",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture(scope="module")
def bouncer(django_db_setup: None, django_db_blocker: Any) -> Iterator[Bouncer]:
    """A migrated scratch database and a PgBouncer in front of it."""
    from django.db import connection

    name = f"eb_bouncer_{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        connection.ensure_connection()  # starts the embedded server when in use
        direct = url_from_settings(connection.settings_dict, dbname=name)
        with connection._nodb_cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
            for setting, value in DATABASE_SETTINGS.items():
                cur.execute(f"ALTER DATABASE \"{name}\" SET {setting} = '{value}'")
    work = Path(tempfile.mkdtemp(prefix="eb-pgbouncer-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        params = conninfo_to_dict(direct)
        server = (
            f"host={params.get('host') or '127.0.0.1'} port={params.get('port') or 5432}"
        )
        user = params.get("user") or "postgres"
        with socket_port() as port:
            pass
        (work / "users.txt").write_text(f'"{user}" ""\n')
        ini = work / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"eb_tx = {server} dbname={name} pool_mode=transaction\n"
            f"eb_session = {server} dbname={name} pool_mode=session\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {work / 'users.txt'}\n"
            f"logfile = {work / 'pgbouncer.log'}\n"
            "max_client_conn = 200\n"
            "default_pool_size = 20\n"
            "ignore_startup_parameters = options\n"
        )
        argv = [str(PGBOUNCER), str(ini)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            shutil.chown(work, "nobody")
            for path in work.iterdir():
                shutil.chown(path, "nobody")
            argv[1:1] = ["-u", "nobody"]
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        base = f"postgresql://{user}@127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                psycopg.connect(f"{base}/eb_session", connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                assert process.poll() is None, process.communicate()[1][-2000:]
                assert time.monotonic() < deadline, "pgbouncer did not answer"
                time.sleep(0.2)
        yield Bouncer(
            direct, f"{base}/eb_tx", f"{base}/eb_session", work / "pgbouncer.log"
        )
    finally:
        if process is not None:
            process.terminate()
            process.communicate(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
        with django_db_blocker.unblock(), connection._nodb_cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _wait_http(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0][-3000:]
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the API did not start")


def test_submit_dispatch_and_long_poll_through_pgbouncer(
    bouncer: Bouncer, tmp_path: Path
) -> None:
    # Given migrations applied and a tenant made through the session pool, an API
    # on the transaction pool (prepared statements off, the listener direct) and a
    # worker on the session pool
    contracts = tmp_path / "contracts.toml"
    contracts.write_text(SIMULATED_CONTRACT, encoding="utf-8")
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    _run_cli(["migrate", "-v0"], _env(bouncer.session_url, contracts, key))
    out = _run_cli(["shell", "-c", TENANT], _env(bouncer.session_url, contracts, key))
    api_key = out.split("API_KEY=", 1)[1].split()[0]
    api_env = {
        **_env(bouncer.transaction_url, contracts, key),
        "EFFECT_BROKER_DB_PREPARED_STATEMENTS": "off",
        "EFFECT_BROKER_LISTEN_DATABASE_URL": bouncer.direct_url,
        "EFFECT_BROKER_READY_WORKER_SECONDS": "0",
    }
    with socket_port() as port:
        url = f"http://127.0.0.1:{port}"
    api = subprocess.Popen(
        [sys.executable, "-m", "effect_broker.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        env=api_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "effect_broker.cli", "worker", "--concurrency", "1"],
        cwd=ROOT,
        env=_env(bouncer.session_url, contracts, key),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    headers = {"Authorization": f"Bearer {api_key}"}

    def submit(n: int) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/effects",
            json={
                "operation_key": f"bouncer:{n}",
                "tool": SIMULATED_TOOL,
                "arguments": {"order": str(n), "amount_minor": 100, "currency": "EUR"},
            },
            headers=headers,
            timeout=30,
        )

    def wait(effect_id: str) -> httpx.Response:
        return httpx.get(
            f"{url}/v1/effects/{effect_id}/wait",
            params={"until": "settled", "timeout": 20},
            headers=headers,
            timeout=30,
        )

    try:
        _wait_http(url, api)
        # When effects are submitted through the API while the worker is frozen, a
        # caller waits on the long-poll, and the worker is thawed (three times, so
        # that the API's statements run on more than one of PgBouncer's server
        # connections)
        answers = []
        for n in range(3):
            worker.send_signal(signal.SIGSTOP)
            submitted = submit(n)
            assert submitted.status_code == 202, submitted.text
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(wait, submitted.json()["effect_id"])
                time.sleep(1.0)  # the long-poll is waiting on the listener now
                thawed = time.monotonic()
                worker.send_signal(signal.SIGCONT)
                answers.append((waiting.result(timeout=40), time.monotonic() - thawed))
        replay = submit(0)
    finally:
        worker.send_signal(signal.SIGCONT)
        api.terminate()
        worker.terminate()
        api_log = api.communicate(timeout=30)[0]
        worker_log = worker.communicate(timeout=30)[0]
    # Then the worker dispatched each one and the long-poll answered it settled,
    # woken by the listener's notification rather than at the end of its 20 s (a
    # LISTEN through the transaction pool loses it: the wait then lasts 20 s)
    for waited, seconds in answers:
        assert waited.status_code == 200, waited.text
        assert waited.json()["status"] == "succeeded", waited.json()
        assert seconds < 10, seconds
    assert replay.status_code == 200
    assert replay.json()["status"] == "succeeded"
    assert "Traceback" not in api_log, api_log[-3000:]
    assert "Traceback" not in worker_log, worker_log[-3000:]
