"""A small real HTTP payment service: the target of the killer demo and the crash matrix.

Spec "Killer demo": "a tiny payment target with an authoritative charges table and
switchable contract modes". It runs as its own process on loopback, so a broker worker
can be SIGKILLed while the target's truth survives in Postgres, in its own schema
(``crash_target`` by default, never the broker's tables). Stdlib HTTP + psycopg only.

Endpoints (JSON)::

    POST /idempotent/charges     Idempotency-Key required; same key + same body within
                                 --key-retention returns the same charge; same key +
                                 other body -> 422 idempotency_key_reused
    POST /reconcilable/charges   no dedup; stores X-Correlation-Key
    POST /unsafe/charges         no dedup, no lookup
    GET  /reconcilable/charges?correlation_key=K
                                 200 with the charge once it is older than
                                 --settlement-delay (DB clock), else 404 not_found
    GET  /stats                  {"charges", "by_mode", "requests",
                                  "stale_fencing_refusals"}
    POST /admin/reset            truncate charges, zero counters, clear faults
    POST /admin/faults           {"fault": F, "times": n, "seconds": s}, F one of
                                 reject_next (429 rejected before the DB: the one
                                   answer documented as "not committed"),
                                 in_progress_next (409 idempotency_key_in_use, not
                                   committed: "a request with this key is in
                                   progress"),
                                 terminal_next (400 rejected, not committed),
                                 slow_commit (hold the charge's transaction open for
                                   `seconds` (default 1) before committing, then
                                   answer normally; with a shorter client read
                                   timeout: a slow commit with a lost response),
                                 drop_connection_after_commit,
                                 error_after_commit (500 internal_error after
                                   the charge committed),
                                 hang_after_commit (no answer for `seconds`, default
                                   30, then close),
                                 slow_after_commit (answers after `seconds`,
                                   default 30),
                                 fail_next_lookup (503 on the next lookup)
                                 `seconds` applies to that fault only.

Every create refuses a body shorter than its Content-Length (400 truncated_body,
nothing committed). Optional fencing (idempotent and reconcilable modes): a create
carrying ``X-Fencing-Token: N`` (a non-negative integer, the broker's claim version)
is refused with 409 stale_fencing_token and commits nothing when a higher token was
already seen for its key; the highest token per key is kept in the ``fencing`` table,
written in the charge's own transaction. A malformed token is 400
invalid_fencing_token. ``X-Attempt-Id`` is accepted for tracing only.

Usage: ``python -m examples.crash_matrix.target_service --database-url URL
[--host 127.0.0.1] [--port 0] [--schema crash_target] [--settlement-delay 1s]
[--key-retention 24h] [--port-file PATH] [--verbose]``
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import re
import select
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
from psycopg import sql

from effect_broker.domain.contracts import parse_duration

MODES = ("idempotent", "reconcilable", "unsafe")
FAULTS = (
    "reject_next",
    "in_progress_next",
    "terminal_next",
    "slow_commit",
    "drop_connection_after_commit",
    "error_after_commit",
    "hang_after_commit",
    "slow_after_commit",
    "fail_next_lookup",
)
MAX_BODY = 1 << 20
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

_SETUP = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.charges (
    id text PRIMARY KEY,
    mode text NOT NULL CHECK (mode IN ('idempotent', 'reconcilable', 'unsafe')),
    idempotency_key text,
    correlation_key text,
    body_hash bytea NOT NULL,
    amount_minor bigint,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS charges_idempotency_key
    ON {schema}.charges (idempotency_key, created_at) WHERE mode = 'idempotent';
CREATE INDEX IF NOT EXISTS charges_correlation_key
    ON {schema}.charges (correlation_key, created_at) WHERE mode = 'reconcilable';
CREATE TABLE IF NOT EXISTS {schema}.fencing (
    mode text NOT NULL,
    key text NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (mode, key)
);
"""
#: Seconds a fault waits when POST /admin/faults names none.
_DEFAULT_SECONDS = {"slow_commit": 1.0}
_TOKEN = re.compile(r"[0-9]{1,18}")


def _closed_by_server(conn: psycopg.Connection[Any]) -> bool:
    """An idle connection whose socket has something to read: the server closed it
    (an idle autocommit connection that LISTENs to nothing is sent nothing else)."""
    if conn.closed:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class HttpError(Exception):
    """An error answer: status and a JSON body."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


class TargetState:
    """The service's database access, fault queue and request counter."""

    def __init__(
        self,
        database_url: str,
        *,
        schema: str,
        settlement_delay: timedelta,
        key_retention: timedelta,
    ) -> None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"schema must match {_SCHEMA_NAME.pattern}")
        self.database_url = database_url
        self.schema_name = schema
        self.schema = sql.Identifier(schema)
        self.settlement_delay = settlement_delay
        self.key_retention = key_retention
        self.requests = 0
        #: Creates refused with 409 stale_fencing_token (nothing committed).
        self.stale_fencing_refusals = 0
        self.faults: dict[str, int] = {}
        self.fault_seconds: dict[str, float] = {}
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._idle: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """Borrow a pooled autocommit connection; a broken one is discarded."""
        conn = self._idle_connection() or psycopg.connect(
            self.database_url, autocommit=True
        )
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        if (
            conn.closed
            or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        ):
            conn.close()
        else:
            self._idle.put(conn)

    def _idle_connection(self) -> psycopg.Connection[Any] | None:
        """A pooled connection the server has not closed, or None.

        After a database restart every idle connection is dead; lent as it is, each
        would fail its next request with a 500 (tests that restart the database saw
        one such 500 answer a later test's charge). The server's close leaves an EOF
        on the socket, seen here without a round trip.
        """
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                return None
            if not _closed_by_server(conn):
                return conn
            conn.close()

    def close(self) -> None:
        """Close every pooled connection."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    def setup(self) -> None:
        """Create the schema, table and indexes (idempotent, safe to race)."""
        with self.connection() as conn, conn.transaction():
            # Two services starting at once could collide in the catalog even with
            # IF NOT EXISTS; the advisory lock serialises their setup.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('crash-target-setup'))")
            conn.execute(sql.SQL(_SETUP).format(schema=self.schema))

    def take_fault(self, name: str) -> bool:
        """Consume one queued ``name`` fault; True if there was one."""
        with self._lock:
            left = self.faults.get(name, 0)
            if left <= 0:
                return False
            self.faults[name] = left - 1
            return True

    def count_request(self) -> None:
        """Count one create request that reached the service."""
        with self._lock:
            self.requests += 1

    def add_fault(self, fault: str, times: int, seconds: float | None) -> int:
        """Queue ``times`` of ``fault``; return how many are now queued."""
        with self._lock:
            self.faults[fault] = self.faults.get(fault, 0) + times
            if seconds is not None:
                self.fault_seconds[fault] = seconds
            return self.faults[fault]

    def seconds(self, fault: str) -> float:
        """How long ``fault`` waits (its own ``seconds``, or the default)."""
        with self._lock:
            return self.fault_seconds.get(fault, _DEFAULT_SECONDS.get(fault, 30.0))

    def _fence(
        self, conn: psycopg.Connection[Any], mode: str, key: str, token: int
    ) -> None:
        # Inside the charge's transaction: the token a refused request would have
        # stored rolls back with it, and two racing claims serialise on the row.
        stored = conn.execute(
            sql.SQL(
                "INSERT INTO {}.fencing AS f (mode, key, token) VALUES (%s, %s, %s) "
                "ON CONFLICT (mode, key) DO UPDATE SET token = EXCLUDED.token "
                "WHERE f.token <= EXCLUDED.token RETURNING token"
            ).format(self.schema),
            [mode, key, token],
        ).fetchone()
        if stored is None:  # a newer claim was already seen for this key
            with self._lock:
                self.stale_fencing_refusals += 1
            raise HttpError(409, "stale_fencing_token")

    def create(
        self,
        mode: str,
        body: dict[str, Any],
        key: str | None,
        *,
        token: int | None = None,
        hold: float = 0.0,
    ) -> dict[str, Any]:
        """Commit one charge (or return the deduplicated one); raise HttpError.

        ``token`` fences the key (refused if older than one already seen); ``hold``
        keeps the transaction open that long after the insert, before the commit.
        """
        body_hash = hashlib.sha256(
            json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        ).digest()
        amount = body.get("amount_minor")
        amount = (
            amount if isinstance(amount, int) and not isinstance(amount, bool) else None
        )
        charges = sql.SQL("{}.charges").format(self.schema)
        with self.connection() as conn, conn.transaction():
            if mode == "idempotent":
                # An advisory lock per key rather than a unique index: after the
                # retention horizon the key is forgotten and the same key must be able
                # to insert again, which a unique index would refuse.
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    [f"{self.schema_name}:idempotent:{key}"],
                )
            if token is not None and key is not None:
                self._fence(conn, mode, key, token)
            if mode == "idempotent":
                found = conn.execute(
                    sql.SQL(
                        "SELECT id, body_hash, amount_minor FROM {} WHERE mode = "
                        "'idempotent' AND idempotency_key = %s AND created_at > "
                        "clock_timestamp() - %s ORDER BY created_at DESC LIMIT 1"
                    ).format(charges),
                    [key, self.key_retention],
                ).fetchone()
                if found is not None:
                    if bytes(found[1]) != body_hash:
                        raise HttpError(422, "idempotency_key_reused")
                    return _charge(found[0], found[2])
            charge_id = f"ch_{uuid.uuid4().hex[:24]}"
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, mode, idempotency_key, correlation_key, "
                    "body_hash, amount_minor) VALUES (%s, %s, %s, %s, %s, %s)"
                ).format(charges),
                [
                    charge_id,
                    mode,
                    key if mode == "idempotent" else None,
                    key if mode == "reconcilable" else None,
                    body_hash,
                    amount,
                ],
            )
            if hold > 0:
                # The charge is written but not committed: a caller that gives up
                # now has lost the answer to a commit that is still to come.
                self.stopping.wait(hold)
        return _charge(charge_id, amount)

    def lookup(self, correlation_key: str) -> dict[str, Any] | None:
        """The oldest settled reconcilable charge with this key, or None."""
        with self.connection() as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT id, amount_minor, count(*) OVER () FROM {}.charges "
                    "WHERE mode = 'reconcilable' AND correlation_key = %s "
                    "AND created_at + %s <= clock_timestamp() ORDER BY created_at LIMIT 1"
                ).format(self.schema),
                [correlation_key, self.settlement_delay],
            ).fetchone()
        if row is None:
            return None
        return {**_charge(row[0], row[1]), "matches": row[2]}

    def stats(self) -> dict[str, Any]:
        """Charge counts from the table and the in-process request counter."""
        with self.connection() as conn:
            rows = conn.execute(
                sql.SQL("SELECT mode, count(*) FROM {}.charges GROUP BY mode").format(
                    self.schema
                )
            ).fetchall()
        by_mode = {mode: 0 for mode in MODES} | {mode: n for mode, n in rows}
        return {
            "charges": sum(by_mode.values()),
            "by_mode": by_mode,
            "requests": self.requests,
            "stale_fencing_refusals": self.stale_fencing_refusals,
        }

    def reset(self) -> None:
        """Truncate the table and forget counters and faults (tests only)."""
        with self.connection() as conn:
            conn.execute(sql.SQL("TRUNCATE {0}.charges, {0}.fencing").format(self.schema))
        with self._lock:
            self.requests = 0
            self.stale_fencing_refusals = 0
            self.faults.clear()


def _charge(charge_id: str, amount: int | None) -> dict[str, Any]:
    return {"id": charge_id, "status": "succeeded", "amount_minor": amount}


class TargetServer(ThreadingHTTPServer):
    """A threading HTTP server that carries the target's state."""

    # socketserver's default listen backlog is 5: a burst of concurrent connects
    # (the concurrency tests, a crash-matrix cell) then meets resets under load.
    request_queue_size = 128

    daemon_threads = True  # a hung handler must not block shutdown
    verbose = False

    def __init__(self, address: tuple[str, int], state: TargetState) -> None:
        super().__init__(address, TargetHandler)
        self.state = state


class TargetHandler(BaseHTTPRequestHandler):
    """Routes the endpoints in the module docstring."""

    server: TargetServer

    def log_message(self, format: str, *args: Any) -> None:
        """One line per request on stderr with --verbose; never the query string."""
        if self.server.verbose:
            path = urlsplit(self.path).path  # the query carries correlation keys
            status = args[1] if len(args) > 1 else "-"
            sys.stderr.write(f"target: {self.command} {path} -> {status}\n")

    def do_GET(self) -> None:
        """Lookup and stats."""
        self._route(self._get)

    def do_POST(self) -> None:
        """Charges and admin."""
        self._route(self._post)

    def _route(self, handler: Callable[[], dict[str, Any] | None]) -> None:
        try:
            result = handler()
        except HttpError as exc:
            self._reply(exc.status, {"error": exc.error})
            return
        except Exception as exc:
            if self.server.verbose:
                sys.stderr.write(f"target: internal error {type(exc).__name__}: {exc}\n")
            self._reply(500, {"error": "internal"})
            return
        if result is not None:
            self._reply(200, result)

    def _get(self) -> dict[str, Any]:
        state = self.server.state
        url = urlsplit(self.path)
        if url.path == "/stats":
            return state.stats()
        if url.path == "/reconcilable/charges":
            if state.take_fault("fail_next_lookup"):
                raise HttpError(503, "lookup_unavailable")
            keys = parse_qs(url.query).get("correlation_key", [])
            if len(keys) != 1 or not keys[0]:
                raise HttpError(400, "correlation_key_required")
            charge = state.lookup(keys[0])
            if charge is None:
                raise HttpError(404, "not_found")
            return charge
        raise HttpError(404, "no_such_endpoint")

    def _read_body(self) -> tuple[bytes, Any]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError as exc:
            raise HttpError(400, "invalid_content_length") from exc
        if not 0 <= length <= MAX_BODY:
            raise HttpError(413, "body_too_large")
        raw = self.rfile.read(length)
        if len(raw) < length:
            # The client closed before sending what it promised: a truncated body
            # must never commit as a (smaller, or empty) charge.
            self.close_connection = True
            raise HttpError(400, "truncated_body")
        try:
            return raw, json.loads(raw) if raw else {}
        except ValueError as exc:
            raise HttpError(400, "invalid_json") from exc

    def _post(self) -> dict[str, Any] | None:
        state = self.server.state
        path = urlsplit(self.path).path
        parts = path.strip("/").split("/")
        if len(parts) == 2 and parts[1] == "charges" and parts[0] in MODES:
            return self._create(parts[0])
        _, body = self._read_body()
        if path == "/admin/reset":
            state.reset()
            return {"reset": True}
        if path == "/admin/faults":
            fault, times = body.get("fault"), body.get("times", 1)
            if fault not in FAULTS or not isinstance(times, int) or times < 1:
                raise HttpError(400, "invalid_fault")
            seconds = body.get("seconds")
            if seconds is not None and not isinstance(seconds, int | float):
                raise HttpError(400, "invalid_fault")
            queued = state.add_fault(fault, times, None if seconds is None else seconds)
            return {"fault": fault, "queued": queued}
        raise HttpError(404, "no_such_endpoint")

    def _create(self, mode: str) -> dict[str, Any] | None:
        state = self.server.state
        state.count_request()
        _, body = self._read_body()
        # Refused before the database is touched: nothing is committed.
        if state.take_fault("reject_next"):
            raise HttpError(429, "rejected")
        if state.take_fault("in_progress_next"):
            raise HttpError(409, "idempotency_key_in_use")
        if state.take_fault("terminal_next"):
            raise HttpError(400, "rejected")
        if not isinstance(body, dict):
            raise HttpError(400, "body_must_be_an_object")
        key: str | None = None
        if mode == "idempotent":
            key = self.headers.get("Idempotency-Key")
            if not key:
                raise HttpError(400, "idempotency_key_required")
        elif mode == "reconcilable":
            key = self.headers.get("X-Correlation-Key") or None
        token_text = self.headers.get("X-Fencing-Token")
        token: int | None = None
        if token_text is not None:
            if not _TOKEN.fullmatch(token_text.strip()):
                raise HttpError(400, "invalid_fencing_token")
            token = int(token_text)
        hold = state.seconds("slow_commit") if state.take_fault("slow_commit") else 0.0
        charge = state.create(mode, body, key, token=token, hold=hold)
        # The commit is done; the faults below lose the answer, never the charge.
        if state.take_fault("drop_connection_after_commit"):
            self._drop()
            return None
        if state.take_fault("error_after_commit"):
            # Charged, then failed: an answer that documents nothing (issue 19).
            raise HttpError(500, "internal_error")
        if state.take_fault("hang_after_commit"):
            state.stopping.wait(state.seconds("hang_after_commit"))
            self._drop()
            return None
        if state.take_fault("slow_after_commit"):
            # Committed, answered late: widens the window in which a kill of the
            # caller lands between the commit and the caller's receipt.
            state.stopping.wait(state.seconds("slow_after_commit"))
        return charge

    def _drop(self) -> None:
        # Close without a status line: the client sees the connection end after its
        # request was fully read, the "response lost after commit" case.
        self.close_connection = True
        with suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _reply(self, status: int, document: dict[str, Any]) -> None:
        payload = json.dumps(document).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:
            self.close_connection = True  # the client went away; nothing to tell it


def _write_port_file(path: str, port: int) -> None:
    # Write then rename, so a parent polling the file never reads half a number.
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as handle:
        handle.write(f"{port}\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run the target service until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="target_service", description=__doc__)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--schema", default="crash_target")
    parser.add_argument("--settlement-delay", type=parse_duration, default="1s")
    parser.add_argument("--key-retention", type=parse_duration, default="24h")
    parser.add_argument("--port-file")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    state = TargetState(
        args.database_url,
        schema=args.schema,
        settlement_delay=args.settlement_delay,
        key_retention=args.key_retention,
    )
    state.setup()
    server = TargetServer((args.host, args.port), state)
    server.verbose = args.verbose
    port = server.server_address[1]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    if args.port_file:
        _write_port_file(args.port_file, port)
    print(f"target listening on http://{args.host}:{port}", flush=True)
    while not stop.wait(0.2):
        pass
    state.stopping.set()  # wake hung handlers
    server.shutdown()
    thread.join()
    server.server_close()
    state.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
