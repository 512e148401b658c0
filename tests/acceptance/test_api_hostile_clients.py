"""Hostile clients against the API as deployed (issue 19): ``effect-broker serve``,
the production command line (uvicorn, ``effect_broker.serving:application``), on a
scratch database, driven over real sockets.

* 40 concurrent ``POST /mcp`` with made-up keys must not take the pool's connections
  with them: a tenant's REST call answers 200 within seconds after, and ``/readyz``
  too; the standalone MCP server keeps no idle connection after them (item 8).
* ``/readyz`` answers 503 ``database_pool`` when the pool cannot lend a connection,
  within about a second (item 8: the Docker health check asks it).
* Clients trickling a body do not hold request slots: while 8 trickle, other requests
  succeed; each trickler is cut off with 408 once it falls behind (item 9).
* A request with both ``Content-Length`` and chunked framing is refused with 400 and
  the connection is closed (item 12).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest

from tests.acceptance import test_api_server
from tests.acceptance.test_api_server import (
    ROOT,
    Scratch,
    _env,
    _read_response,
    connections_of,
    socket_port,
    submit_body,
    wait_for_lock_waiter,
)
from tests.served import served

#: test_api_server.py's migrated scratch database (module-scoped), shared by name.
scratch = test_api_server.scratch

pytestmark = pytest.mark.slow


MCP_RPC = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
MCP_ACCEPT = "application/json, text/event-stream"


@contextmanager
def serve(scratch: Scratch, tag: str, settings: dict[str, str]) -> Iterator[str]:
    """``effect-broker serve`` on ``scratch``, its connections tagged ``tag``; the
    base URL once ``/healthz`` answers. No worker runs: readiness skips that check."""
    with socket_port() as port:
        yield from _started(
            ["serve", "--port", str(port), "--no-access-log"],
            port,
            scratch,
            tag,
            {"EFFECT_BROKER_READY_WORKER_SECONDS": "0", **settings},
        )


def _started(
    args: list[str],
    port: int,
    scratch: Scratch,
    tag: str,
    settings: dict[str, str],
    output: list[str] | None = None,
) -> Iterator[str]:
    """``effect-broker <args>`` serving on ``port``: its base URL while it runs; its
    output must hold no traceback (and is appended to ``output`` when given)."""
    sep = "&" if "?" in scratch.url else "?"
    env = {**_env(f"{scratch.url}{sep}application_name={tag}"), **settings}
    log = tempfile.TemporaryFile()  # noqa: SIM115  (closed with the server below)
    process = subprocess.Popen(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    with log, served(process, f"http://127.0.0.1:{port}", args[0], log) as base:
        yield base
        log.seek(0)
        text = log.read().decode(errors="replace")
        assert "Traceback" not in text, text[-3000:]
        if output is not None:
            output.append(text)


def bad_key_mcp_posts(base: str, count: int) -> list[int]:
    """``count`` concurrent ``POST /mcp``, each with its own made-up ``eb_`` key."""

    async def one(client: httpx.AsyncClient) -> int:
        response = await client.post(
            "/mcp",
            json=MCP_RPC,
            headers={
                "Authorization": f"Bearer eb_{uuid.uuid4().hex}",
                "Accept": MCP_ACCEPT,
            },
        )
        return response.status_code

    async def all_at_once() -> list[int]:
        limits = httpx.Limits(max_connections=count)
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
            return list(await asyncio.gather(*(one(client) for _ in range(count))))

    return asyncio.run(all_at_once())


# --- item 8: the /mcp key check leaked a pooled connection per request ---------------


def test_bad_mcp_keys_leave_the_pool_whole_for_the_tenants_rest_calls(
    scratch: Scratch,
) -> None:
    tag = "eb-hostile-mcp-keys"
    # Given the API with its production pool (8) and in-flight limit
    with serve(scratch, tag, {}) as base:
        # When 40 unauthenticated clients POST /mcp at once with made-up keys
        statuses = bad_key_mcp_posts(base, 40)
        # Then each is refused
        assert statuses == [401] * 40
        # and a tenant's REST call right after answers 200 within seconds
        started = time.monotonic()
        listed = httpx.get(
            f"{base}/v1/effects",
            headers={"Authorization": f"Bearer {scratch.api_key}"},
            timeout=30,
        )
        elapsed = time.monotonic() - started
        assert listed.status_code == 200, listed.text[:500]
        assert elapsed < 2.0, elapsed
        ready = httpx.get(f"{base}/readyz", timeout=30)
        assert ready.status_code == 200, ready.text[:500]
        # and the process holds no more connections than its pool
        assert connections_of(scratch, tag) <= 8


def test_bad_keys_leave_the_standalone_mcp_server_no_idle_connection(
    scratch: Scratch,
) -> None:
    tag = "eb-hostile-mcp-standalone"
    with socket_port() as port:
        args = ["mcp", "--transport", "http", "--port", str(port)]
        for base in _started(args, port, scratch, tag, {}):
            # Given the standalone MCP server (no pool: a connection per key check)
            assert connections_of(scratch, tag) == 0
            # When 40 clients with made-up keys POST /mcp at once
            statuses = bad_key_mcp_posts(base, 40)
            # Then each is refused and no connection is left open after them (a
            # closed connection's backend leaves pg_stat_activity within moments; a
            # leaked one stays for good)
            assert statuses == [401] * 40
            deadline = time.monotonic() + 3
            while (left := connections_of(scratch, tag)) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert left == 0


def test_readyz_is_503_database_pool_when_the_pool_cannot_lend_a_connection(
    scratch: Scratch,
) -> None:
    tag = "eb-hostile-readyz"
    headers = {"Authorization": f"Bearer {scratch.api_key}"}
    key = f"hostile:readyz:{uuid.uuid4().hex[:8]}"
    # Given a pool of one connection, whose pool timeout is long
    settings = {
        "EFFECT_BROKER_API_DB_POOL_MAX_SIZE": "1",
        "EFFECT_BROKER_API_DB_POOL_TIMEOUT": "20",
        "EFFECT_BROKER_API_MAX_IN_FLIGHT": "4",
    }
    with (
        serve(scratch, tag, settings) as base,
        scratch.admin_connect() as lock,
        ThreadPoolExecutor(1) as pool,
    ):
        first = httpx.get(f"{base}/readyz", timeout=30)
        assert first.status_code == 200, first.text
        # and a submit holding that connection (blocked on a lock taken here)
        lock.autocommit = False
        lock.execute("LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE")
        held = pool.submit(
            httpx.post,
            f"{base}/v1/effects",
            json=submit_body(key),
            headers=headers,
            timeout=60,
        )
        wait_for_lock_waiter(scratch, tag)
        # When the health check asks
        started = time.monotonic()
        drained = httpx.get(f"{base}/readyz", timeout=30)
        elapsed = time.monotonic() - started
        lock.rollback()
        assert held.result(timeout=30).status_code == 202
        # Then it is not ready, at once, and says why
        assert drained.status_code == 503, drained.text[:500]
        assert drained.headers["content-type"] == "application/problem+json"
        problem = drained.json()
        assert problem["code"] == "not_ready"
        assert [r["check"] for r in problem["reasons"]] == ["database_pool"]
        assert problem["reasons"][0]["detail"].startswith(
            "the connection pool lent no connection within 1s (1 of 1 lent"
        )
        assert elapsed < 3.0, elapsed
        # and ready again once the connection is back
        assert httpx.get(f"{base}/readyz", timeout=30).status_code == 200


# --- item 9: slow bodies held request slots ------------------------------------------


def _open_trickle(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = (
        "POST /v1/effects HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Content-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


def test_trickled_bodies_hold_no_slot_and_are_cut_off_after_the_bound(
    scratch: Scratch,
) -> None:
    tag = "eb-hostile-trickle"
    headers = {"Authorization": f"Bearer {scratch.api_key}"}
    # Given the API with its production in-flight limit (8) and body limits
    with serve(scratch, tag, {}) as base:
        # When 8 unauthenticated clients trickle a byte every second
        socks = [_open_trickle(base) for _ in range(8)]
        stop = threading.Event()
        answered: dict[int, float] = {}
        started = time.monotonic()

        def trickle() -> None:
            while not stop.wait(1.0) and len(answered) < len(socks):
                for n, sock in enumerate(socks):
                    if n in answered:
                        continue
                    if select.select([sock], [], [], 0)[0]:
                        answered[n] = time.monotonic() - started
                        continue
                    try:
                        sock.sendall(b"{")
                    except OSError:
                        answered[n] = time.monotonic() - started

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        try:
            time.sleep(1.5)  # every trickler's head is in and its body under way
            # Then other requests are served meanwhile, each at once
            others = []
            for _ in range(5):
                t0 = time.monotonic()
                response = httpx.get(f"{base}/v1/effects", headers=headers, timeout=30)
                others.append((response.status_code, time.monotonic() - t0))
            assert [status for status, _ in others] == [200] * 5, others
            assert max(seconds for _, seconds in others) < 2.0, others
            # and each trickler is answered 408 once behind the rate (5 s head start
            # at 1024 B/s): well before its 30 s total
            trickler.join(timeout=30)
            assert sorted(answered) == list(range(8)), answered
            assert max(answered.values()) < 12.0, answered
            for sock in socks:
                status, response_headers, body = _read_response(sock)
                assert status == 408, body[:500]
                assert response_headers["connection"] == "close"
                assert json.loads(body)["code"] == "request_timeout"
                # and the connection is closed: an EOF, or a reset when one of our
                # trickled bytes crossed the server's close (the kernel answers RST)
                try:
                    rest = sock.recv(1024)
                except ConnectionResetError:
                    rest = b""
                assert rest == b""
        finally:
            stop.set()
            for sock in socks:
                sock.close()


# --- item 12: Content-Length together with chunked framing ---------------------------


def test_content_length_with_chunked_framing_is_400_and_the_connection_closed(
    scratch: Scratch,
) -> None:
    with serve(scratch, "eb-hostile-framing", {}) as base:
        host, port = base.removeprefix("http://").split(":")
        request = (
            "POST /v1/effects HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n"
            f"Authorization: Bearer {scratch.api_key}\r\n"
            "Content-Type: application/json\r\n"
            "Content-Length: 4\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
            "0\r\n\r\n"
            # A second request on the same connection: a smuggled one, if it runs.
            "GET /v1/effects HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n"
            f"Authorization: Bearer {scratch.api_key}\r\n\r\n"
        )
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request.encode())
            status, headers, body = _read_response(sock)
            rest = b""
            while chunk := sock.recv(65536):
                rest += chunk
    assert status == 400, body[:500]
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/problem+json"
    assert json.loads(body)["code"] == "invalid_request"
    # The connection is closed after the answer: the second request never ran.
    assert rest == b""


# --- issue 25: serve --wsgi ----------------------------------------------------------


def test_serve_wsgi_serves_the_api_and_keeps_a_query_credential_out_of_its_log(
    scratch: Scratch,
) -> None:
    # Given the API served by `effect-broker serve --wsgi` (gunicorn's threads) with
    # its access log on
    key = scratch.api_key
    output: list[str] = []
    with socket_port() as port:
        started = _started(
            ["serve", "--wsgi", "--port", str(port)],
            port,
            scratch,
            "eb-hostile-wsgi",
            {"EFFECT_BROKER_READY_WORKER_SECONDS": "0"},
            output,
        )
        base = next(started)
        try:
            # When a tenant submits, and a caller puts a key in the query string
            submitted = httpx.post(
                f"{base}/v1/effects",
                json=submit_body(f"wsgi:{uuid.uuid4().hex[:8]}"),
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
            refused = httpx.get(f"{base}/v1/effects?api_key={key}", timeout=30)
            mcp = httpx.post(f"{base}/mcp", json=MCP_RPC, timeout=30)
        finally:
            with contextlib.suppress(StopIteration):
                next(started)
    # Then the submit is accepted, the credential refused as on ASGI, and /mcp is
    # not served here (it stays on ASGI: `effect-broker mcp --transport http`)
    assert submitted.status_code == 202, submitted.text
    assert refused.status_code == 400
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["code"] == "credential_in_query"
    assert mcp.status_code == 404
    # and the access log has both requests, without the key
    (log,) = output
    assert '"GET /v1/effects HTTP/1.1" 400' in log, log[-3000:]
    assert '"POST /v1/effects HTTP/1.1" 202' in log
    assert key not in log
