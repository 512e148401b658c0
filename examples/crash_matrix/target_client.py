"""Start, drive and inspect the target service process (tests and the crash matrix).

``start_target`` runs ``python -m examples.crash_matrix.target_service`` as a child
process and waits for its port file, so nothing races the bind. ``count_charges`` reads
the target's table with direct SQL: the target's own truth, independent of anything the
service (or the broker) says about it. ``ServiceHarness`` adapts a running service to
``effect_broker.adapters.conformance.TargetHarness``.

Counting (issue 9, "Test target"): a charge made under a downstream key is counted by
that key in the column its mode stores it in (``count_by_key``); a charge without one
(unsafe mode, and the baselines' charges, whose keys the matrix does not control) by
the hash of its body (``count_by_body``). ``charges`` lists every row, so the matrix
can report the ones no cell counted.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import psycopg
from psycopg import sql

from effect_broker.domain.contracts import parse_duration

ROOT = Path(__file__).resolve().parents[2]
#: The column in which the target stores the downstream key of each keyed mode.
KEY_COLUMNS = {"idempotent": "idempotency_key", "reconcilable": "correlation_key"}


def body_digest(body: dict[str, Any]) -> bytes:
    """The target's ``body_hash`` of ``body`` (SHA-256 of its sorted, compact JSON)."""
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).digest()


@dataclass(frozen=True)
class Charge:
    """One row of the target's ``charges`` table, as the matrix attributes it."""

    id: str
    mode: str
    idempotency_key: str | None
    correlation_key: str | None
    body_hash: bytes

    @property
    def key(self) -> str | None:
        """The downstream key this charge was made under (None: unkeyed)."""
        return self.idempotency_key if self.mode == "idempotent" else self.correlation_key

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the body hash in hex)."""
        return {
            "id": self.id,
            "mode": self.mode,
            "key": self.key,
            "body_hash": self.body_hash.hex(),
        }


class TargetProcess:
    """A running target service: its URL, its process and its database schema."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        url: str,
        *,
        database_url: str,
        schema: str,
        settlement_delay: timedelta,
        key_retention: timedelta,
        workdir: tempfile.TemporaryDirectory[str],
    ) -> None:
        self.process = process
        self.url = url
        self.database_url = database_url
        self.schema = schema
        self.settlement_delay = settlement_delay
        self.key_retention = key_retention
        self._workdir = workdir

    def _request(self, method: str, path: str, body: object = None) -> Any:
        # trust_env=False: an environment proxy must not sit between us and loopback.
        with httpx.Client(base_url=self.url, trust_env=False, timeout=10.0) as client:
            response = client.request(method, path, json=body)
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        """``GET /stats``: charge counts and the number of create requests received."""
        result: dict[str, Any] = self._request("GET", "/stats")
        return result

    def reset(self) -> None:
        """``POST /admin/reset``: empty the charges table, counters and faults."""
        self._request("POST", "/admin/reset", {})

    def inject(self, fault: str, times: int = 1, *, seconds: float | None = None) -> None:
        """``POST /admin/faults``: queue ``fault`` for the next ``times`` requests."""
        body: dict[str, object] = {"fault": fault, "times": times}
        if seconds is not None:
            body["seconds"] = seconds
        self._request("POST", "/admin/faults", body)

    def count_charges(self, mode: str | None = None, key: str | None = None) -> int:
        """Rows in the target's table (by mode and/or idempotency/correlation key)."""
        query = sql.SQL(
            "SELECT count(*) FROM {}.charges WHERE (%(mode)s::text IS NULL OR "
            "mode = %(mode)s) AND (%(key)s::text IS NULL OR idempotency_key = %(key)s "
            "OR correlation_key = %(key)s)"
        ).format(sql.Identifier(self.schema))
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute(query, {"mode": mode, "key": key}).fetchone()
        return int(row[0]) if row else 0

    def count_by_body(self, body: dict[str, Any]) -> int:
        """Rows whose request body was exactly ``body`` (the service's own body hash).

        Unsafe charges carry no key; a body unique to one test case still maps every
        row back to the case that caused it.
        """
        query = sql.SQL("SELECT count(*) FROM {}.charges WHERE body_hash = %s").format(
            sql.Identifier(self.schema)
        )
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute(query, [body_digest(body)]).fetchone()
        return int(row[0]) if row else 0

    def count_by_key(self, mode: str, key: str) -> int:
        """Rows of keyed ``mode`` made under downstream ``key``, whatever their body.

        A body-blind count: a charge the target committed under the effect's key is
        the effect's charge even if its body differs from the one the cell sent.
        """
        column = KEY_COLUMNS[mode]  # KeyError: unsafe mode has no key to count by
        query = sql.SQL(
            "SELECT count(*) FROM {}.charges WHERE mode = %s AND {} = %s"
        ).format(sql.Identifier(self.schema), sql.Identifier(column))
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute(query, [mode, key]).fetchone()
        return int(row[0]) if row else 0

    def charges(self) -> list[Charge]:
        """Every row of the target's table, oldest first."""
        query = sql.SQL(
            "SELECT id, mode, idempotency_key, correlation_key, body_hash "
            "FROM {}.charges ORDER BY created_at, id"
        ).format(sql.Identifier(self.schema))
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            rows = conn.execute(query).fetchall()
        return [Charge(row[0], row[1], row[2], row[3], bytes(row[4])) for row in rows]

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in ``timeout`` seconds."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._workdir.cleanup()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the service (a crash, not a shutdown) and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._workdir.cleanup()

    def harness(self) -> ServiceHarness:
        """This service as a conformance ``TargetHarness``."""
        return ServiceHarness(self)

    def __enter__(self) -> TargetProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_target(
    database_url: str,
    *,
    settlement_delay: str = "1s",
    key_retention: str = "24h",
    schema: str = "crash_target",
    host: str = "127.0.0.1",
    port: int = 0,
    verbose: bool = False,
    startup_timeout: float = 30.0,
) -> TargetProcess:
    """Start the target service and return once it is listening."""
    workdir = tempfile.TemporaryDirectory(prefix="eb-target-")
    port_file = Path(workdir.name) / "port"
    command = [
        sys.executable,
        "-m",
        "examples.crash_matrix.target_service",
        "--database-url",
        database_url,
        "--host",
        host,
        "--port",
        str(port),
        "--schema",
        schema,
        "--settlement-delay",
        settlement_delay,
        "--key-retention",
        key_retention,
        "--port-file",
        str(port_file),
    ]
    if verbose:
        command.append("--verbose")
    # cwd=ROOT puts the repository on the child's sys.path (``python -m``). Its output
    # goes to a file: an inherited pipe would keep a parent's reader waiting for EOF
    # for as long as the service lives.
    with (Path(workdir.name) / "target.log").open("ab") as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + startup_timeout
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            if process.poll() is None:
                process.kill()
            process.wait()
            log_text = (Path(workdir.name) / "target.log").read_text(errors="replace")
            workdir.cleanup()
            raise RuntimeError(
                f"target service did not start (exit code {process.returncode}): "
                + (log_text.strip().splitlines() or [""])[-1]
            )
        time.sleep(0.02)
    bound = int(port_file.read_text(encoding="ascii"))
    return TargetProcess(
        process,
        f"http://{host}:{bound}",
        database_url=database_url,
        schema=schema,
        settlement_delay=parse_duration(settlement_delay),
        key_retention=parse_duration(key_retention),
        workdir=workdir,
    )


class ServiceHarness:
    """``TargetHarness`` for a running target service (real time, real sockets)."""

    def __init__(self, target: TargetProcess) -> None:
        self.target = target

    def effect_count(self, key: str | None) -> int:
        """Rows recorded under ``key`` (idempotency or correlation key; None: all)."""
        return self.target.count_charges(key=key)

    def request_count(self) -> int:
        """Create requests that reached the service."""
        return int(self.target.stats()["requests"])

    def lose_next_response(self) -> None:
        """Commit the next charge, then close the socket without answering."""
        self.target.inject("drop_connection_after_commit")

    def fail_after_commit_next(self) -> None:
        """Queue error_after_commit (a 500 after the charge committed)."""
        self.target.inject("error_after_commit")

    def reject_next(self) -> None:
        """Answer the next create with 503 before touching the database."""
        self.target.inject("reject_next")

    def probe_unavailable_next(self) -> None:
        """Answer the next lookup with 503."""
        self.target.inject("fail_next_lookup")

    def reset(self) -> None:
        """Empty the table and counters."""
        self.target.reset()

    def settlement_bound(self) -> timedelta | None:
        """The service's real settlement delay."""
        return self.target.settlement_delay

    def advance_past_settlement(self) -> None:
        """Sleep past the settlement delay (the DB clock moves with the wall clock)."""
        time.sleep(self.target.settlement_delay.total_seconds() + 0.05)


__all__ = [
    "Charge",
    "ServiceHarness",
    "TargetProcess",
    "body_digest",
    "start_target",
]
