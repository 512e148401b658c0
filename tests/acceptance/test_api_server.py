"""The API as deployed: ``uvicorn config.asgi:application`` in its own process, on a
scratch database, driven over real sockets.

* More concurrent callers than the pool holds: the process never holds more database
  connections than its pool size, and every request succeeds (issue 13: connections
  followed in-flight requests with no bound, and became 500s past max_connections).
* The in-flight limit and an exhausted pool both answer 503 ``overloaded`` with
  ``Retry-After``, never a 500, and the refused requests did nothing.
* The admin login works through the same process.
* A body over the size limit is 413 ``payload_too_large`` before it is read: a
  declared length at once, a chunked upload after at most about the limit, with no
  Authorization header (issue 12: 300 MiB were read to disk before the 401).
* A key sent in the query string is refused, and is not in the access log.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
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

from config.database import url_from_settings

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

POOL_SIZE = 3
CLIENTS = 24  # eight times the pool
TOOL_ARGS = {"order": "9", "amount_minor": 100, "currency": "EUR"}
SETUP = """
from django.contrib.auth.models import User
from effect_broker.services.tenants import create_tenant
User.objects.create_superuser("olga", "olga@example.invalid", "s3cret-pass")
print("API_KEY=" + create_tenant("acceptance")[1])
"""


@dataclass
class Scratch:
    """A migrated scratch database with a tenant and a superuser."""

    name: str
    url: str
    api_key: str

    def admin_connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, autocommit=True)


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    return {**env, "DATABASE_URL": url, "DEBUG": "0", "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def scratch(django_db_setup: None, django_db_blocker: Any) -> Iterator[Scratch]:
    from django.db import connection

    name = f"eb_api_{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        connection.ensure_connection()  # starts the embedded server when in use
        url = url_from_settings(connection.settings_dict, dbname=name)
        with connection._nodb_cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
    try:
        for args in (["migrate", "-v0"], ["shell", "-c", SETUP]):
            done = subprocess.run(
                [sys.executable, "-m", "effect_broker.cli", *args],
                cwd=ROOT,
                env=_env(url),
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-2000:]
        match = re.search(r"API_KEY=(\S+)", done.stdout)
        assert match, done.stdout
        yield Scratch(name, url, match.group(1))
    finally:
        with django_db_blocker.unblock(), connection._nodb_cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Server:
    """One ``uvicorn config.asgi:application`` process; its connections are tagged."""

    def __init__(
        self,
        scratch: Scratch,
        tag: str,
        settings: dict[str, str],
        *,
        access_log: bool = False,
    ) -> None:
        self.tag = f"eb-acceptance-{tag}"
        sep = "&" if "?" in scratch.url else "?"
        env = {
            **_env(f"{scratch.url}{sep}application_name={self.tag}"),
            **settings,
        }
        with socket_port() as port:
            self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "config.asgi:application",
                "--port",
                str(port),
                "--access-log" if access_log else "--no-access-log",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.communicate()[0][-3000:]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError("uvicorn did not start")

    def stop(self) -> str:
        self.process.terminate()
        try:
            return self.process.communicate(timeout=15)[0]
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.communicate()[0]


class socket_port:
    """A free TCP port (closed again before uvicorn binds it)."""

    def __enter__(self) -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture(scope="module")
def pooled(scratch: Scratch) -> Iterator[Server]:
    """The API with a pool of 3 (its in-flight limit follows: 3), started with the
    persistent-connection setting that leaked under ASGI (issue 13), as a shared
    environment would give it: the API must ignore it and say so."""
    server = Server(
        scratch,
        "pooled",
        {
            "EFFECT_BROKER_DB_CONN_MAX_AGE": "300",
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE": str(POOL_SIZE),
            "EFFECT_BROKER_API_DB_POOL_MIN_SIZE": "1",
            # generous: this test is about connections, not refusals
            "EFFECT_BROKER_API_QUEUE_TIMEOUT": "60",
            # No tenant rate limit: its 24 callers are one tenant, and under the
            # default (100/s, burst 200) a fast enough machine got 429s, so the
            # verdict followed the machine's speed (issue 19). The limit has its
            # own tests (tests/integration/test_api_rate_limit.py).
            "EFFECT_BROKER_TENANT_SUBMIT_RATE": "0",
        },
    )
    yield server
    log = server.stop()
    assert "Traceback" not in log, log[-3000:]
    assert "EFFECT_BROKER_DB_CONN_MAX_AGE=300 is ignored by the API process" in log


def connections_of(scratch: Scratch, tag: str) -> int:
    with scratch.admin_connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND application_name = %s",
            (scratch.name, tag),
        ).fetchone()
    return int(row[0]) if row else -1


def submit_body(key: str) -> dict[str, Any]:
    return {"operation_key": key, "tool": "charge_card", "arguments": TOOL_ARGS}


def test_connections_stay_within_the_pool_with_eight_times_more_callers(
    scratch: Scratch, pooled: Server
) -> None:
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        with scratch.admin_connect() as conn:
            while not stop.wait(0.02):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                    "AND application_name = %s",
                    (scratch.name, pooled.tag),
                ).fetchone()
                peak = max(peak, int(row[0]) if row else 0)

    statuses: list[int | str] = []

    async def caller(n: int, until: float) -> None:
        headers = {"Authorization": f"Bearer {scratch.api_key}"}
        async with httpx.AsyncClient(base_url=pooled.url, headers=headers) as client:
            i = 0
            while time.monotonic() < until or i == 0:
                key = f"acc:{n}:{i}:{uuid.uuid4().hex[:6]}"
                try:
                    response = await client.post(
                        "/v1/effects", json=submit_body(key), timeout=60
                    )
                    statuses.append(response.status_code)
                except httpx.HTTPError as exc:
                    statuses.append(type(exc).__name__)
                i += 1

    async def load() -> None:
        until = time.monotonic() + 3
        await asyncio.gather(*(caller(n, until) for n in range(CLIENTS)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        asyncio.run(load())
    finally:
        stop.set()
        sampler.join(timeout=5)
    assert len(statuses) >= CLIENTS
    assert {s for s in statuses if s != 202} == set(), statuses
    assert 1 <= peak <= POOL_SIZE
    assert connections_of(scratch, pooled.tag) <= POOL_SIZE


def test_admin_login_works_on_the_real_server(pooled: Server) -> None:
    with httpx.Client(base_url=pooled.url) as client:
        page = client.get("/admin/login/")
        assert page.status_code == 200
        token = client.cookies["csrftoken"]
        response = client.post(
            "/admin/login/?next=/admin/",
            data={
                "username": "olga",
                "password": "s3cret-pass",
                "csrfmiddlewaretoken": token,
            },
            headers={"Referer": f"{pooled.url}/admin/login/"},
        )
        assert response.status_code == 302, response.text[:1000]
        assert response.headers["location"] == "/admin/"
        index = client.get("/admin/")
        assert index.status_code == 200
        assert "Site administration" in index.text
        # The API on the same process sets no session or CSRF cookie.
        health = client.get("/healthz")
        assert "set-cookie" not in health.headers


MAX_BODY = 256 * 1024  # the default EFFECT_BROKER_MAX_BODY_BYTES
UPLOAD = 300 << 20  # what the caller tries to send: 300 MiB


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length, read off ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)
    }
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(status_line.split()[1]), headers, body


def _request_head(url: str, **headers: str) -> bytes:
    host = url.removeprefix("http://")
    lines = [
        "POST /v1/effects HTTP/1.1",
        f"Host: {host}",
        "Content-Type: application/json",
        *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_chunked_unauthenticated_upload_over_the_limit_is_413_before_it_is_read(
    pooled: Server,
) -> None:
    # Given a client streaming 300 MiB, chunked, with no Authorization header
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    started = time.monotonic()
    with _connect(pooled.url) as sock:
        sock.sendall(_request_head(pooled.url, Transfer_Encoding="chunked"))
        # When it sends until the server answers (or stops reading)
        while sent < UPLOAD:
            readable, _, _ = select.select([sock], [], [], 0.01)
            if readable:
                break
            try:
                sock.sendall(frame)
            except OSError:  # the server closed the connection: read its answer
                break
            sent += len(chunk)
        status, headers, body = _read_response(sock)
    elapsed = time.monotonic() - started
    # Then it is 413 problem+json, not a 401 after reading it all
    assert status == 413, body[:500]
    assert headers["content-type"] == "application/problem+json"
    assert json.loads(body)["code"] == "payload_too_large"
    # and the server stopped it near the limit: what was sent before the answer is
    # the limit plus what the socket buffers hold, far from the 300 MiB
    assert sent < 16 << 20, sent
    # Only a liveness bound (issue 19): the byte count above is the guarantee; this
    # says the exchange did not hang, with room for a loaded machine.
    assert elapsed < 30


def test_a_declared_length_over_the_limit_is_413_without_waiting_for_the_body(
    pooled: Server,
) -> None:
    with _connect(pooled.url) as sock:
        # Only the head is sent: an answer proves the body was never awaited.
        sock.sendall(_request_head(pooled.url, Content_Length=str(UPLOAD)))
        status, headers, body = _read_response(sock)
    assert status == 413, body[:500]
    assert headers["connection"] == "close"
    assert json.loads(body) == {
        "type": "/problems/payload_too_large",
        "title": "payload too large",
        "status": 413,
        "code": "payload_too_large",
        "detail": f"request body exceeds {MAX_BODY} bytes",
        "limit": MAX_BODY,
    }


def test_a_body_within_the_limit_still_reaches_the_api(
    scratch: Scratch, pooled: Server
) -> None:
    body = submit_body(f"acc:limit:{uuid.uuid4().hex[:6]}")
    # ~250 KB, just under the limit, in strings under the argument string cap
    body["arguments"] = {**TOOL_ARGS, "pad": ["x" * 50_000] * 5}
    response = httpx.post(
        f"{pooled.url}/v1/effects",
        json=body,
        headers={"Authorization": f"Bearer {scratch.api_key}"},
        timeout=30,
    )
    assert response.status_code == 202, response.text[:500]


def test_a_key_in_the_query_string_is_refused_and_kept_out_of_the_access_log(
    scratch: Scratch,
) -> None:
    server = Server(scratch, "query-key", {}, access_log=True)
    try:
        key = scratch.api_key
        answers = [
            httpx.get(f"{server.url}/v1/effects?api_key={key}&tool=charge_card"),
            httpx.get(f"{server.url}/v1/effects?k={key}"),
            httpx.get(f"{server.url}/healthz?token=t0ps3cret"),
        ]
        allowed = httpx.get(f"{server.url}/healthz?probe=1")
    finally:
        log = server.stop()
    for answer in answers:
        assert answer.status_code == 400, answer.text[:500]
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["code"] == "credential_in_query"
    assert allowed.status_code == 200
    assert key not in log
    assert "t0ps3cret" not in log
    # the requests are logged, without the credential
    assert '"GET /v1/effects?tool=charge_card HTTP/1.1" 400' in log, log[-3000:]
    assert '"GET /healthz?probe=1 HTTP/1.1" 200' in log


def test_limit_and_pool_exhaustion_are_503_overloaded_never_500(
    scratch: Scratch,
) -> None:
    # A pool of one connection and two request slots. A caller holds the pool's
    # connection (blocked on a table lock taken here); a second is admitted and
    # waits for a connection (pool timeout 1 s); a third waits for a slot (0.3 s).
    server = Server(
        scratch,
        "tight",
        {
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE": "1",
            "EFFECT_BROKER_API_DB_POOL_TIMEOUT": "1",
            "EFFECT_BROKER_API_MAX_IN_FLIGHT": "2",
            "EFFECT_BROKER_API_QUEUE_TIMEOUT": "0.3",
        },
    )
    headers = {"Authorization": f"Bearer {scratch.api_key}"}
    keys = [f"tight:{uuid.uuid4().hex[:8]}:{n}" for n in range(3)]

    def submit(key: str) -> httpx.Response:
        return httpx.post(
            f"{server.url}/v1/effects", json=submit_body(key), headers=headers, timeout=30
        )

    try:
        with scratch.admin_connect() as lock, ThreadPoolExecutor(3) as pool:
            lock.autocommit = False
            lock.execute("LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE")
            first = pool.submit(submit, keys[0])
            wait_for_lock_waiter(scratch, server.tag)
            second = pool.submit(submit, keys[1])
            time.sleep(0.3)  # admitted, and waiting for the pool's one connection
            third = pool.submit(submit, keys[2])
            refused = [second.result(timeout=20), third.result(timeout=20)]
            lock.rollback()
            assert first.result(timeout=20).status_code == 202
    finally:
        log = server.stop()
    for response in refused:
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["retry-after"] == "1"
        assert response.json()["code"] == "overloaded"
    assert {r.json()["reason"] for r in refused} == {"in_flight_limit", "database_pool"}
    assert "Traceback" not in log, log[-3000:]
    with scratch.admin_connect() as conn:
        rows = conn.execute(
            "SELECT operation_key FROM effect_intents WHERE operation_key = ANY(%s)",
            (keys,),
        ).fetchall()
    assert [r[0] for r in rows] == [keys[0]]  # the refused requests did nothing


def wait_for_lock_waiter(scratch: Scratch, tag: str) -> None:
    deadline = time.monotonic() + 20
    with scratch.admin_connect() as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND application_name = %s AND wait_event_type = 'Lock'",
                (scratch.name, tag),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)
    raise AssertionError("the first request never reached the locked table")
