"""The crash matrix's test rig: a scratch database, the target service, a supervised
pool of real worker processes, and helpers to submit, wait and count.

Everything the verdicts rely on is read from the source of truth: target effects from
the target's own table (never from the broker), broker state from the ledger. Every
count of target charges is also a claim (``examples.crash_matrix.attribution``), so the
run can name any charge that no cell counted.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections
from psycopg import sql

from config.database import url_from_settings
from effect_broker import embedded_pg, failpoints, store
from effect_broker.domain.contracts import load_contracts
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectReceipt, StaleWrite, Tenant
from effect_broker.services import runtime
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.attribution import ChargeClaims
from examples.crash_matrix.contracts import TOOLS, write_contracts
from examples.crash_matrix.naive_runner import ensure_schema
from examples.crash_matrix.plan import safety_of
from examples.crash_matrix.target_client import (
    KEY_COLUMNS,
    Charge,
    TargetProcess,
    start_target,
)
from examples.crash_matrix.workers import ROOT, WorkerProcess, broker_env, wait_until

OPERATION_KEY = "order:42:charge:v1"
#: States after which nothing more happens without an operator.
SETTLED = {EffectStatus.SUCCEEDED, EffectStatus.FAILED_FINAL, EffectStatus.MANUAL_REVIEW}


@dataclass(frozen=True)
class WorkerExit:
    """A worker process the pool found dead (and replaced)."""

    name: str
    pid: int
    returncode: int | None

    def __str__(self) -> str:
        return f"{self.name} (pid {self.pid}, exit code {self.returncode})"


class WorkerPool:
    """N worker processes; a supervisor replaces any that die (as a deployment would).

    Every replacement is recorded (``exits``): a kill cell expects some, while a
    database-restart cell fails if any worker exited (issue 11: the workers must
    outlive the database, not be replaced after it).
    """

    def __init__(self, env: dict[str, str], size: int) -> None:
        self.env = env
        self.restarts = 0
        #: Every worker found dead, in order; ``exits_since`` reads a slice.
        self.exits: list[WorkerExit] = []
        self._serial = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.workers = [self._spawn() for _ in range(size)]
        self._thread = threading.Thread(target=self._supervise, daemon=True)
        self._thread.start()

    def _spawn(self) -> WorkerProcess:
        self._serial += 1
        # concurrency 1: a worker holds at most one effect, so a kill aimed at one
        # effect never takes another effect's dispatch down with it.
        return WorkerProcess(f"matrix-w{self._serial}", self.env, concurrency=1)

    def _supervise(self) -> None:
        while not self._stop.wait(0.2):
            self._replace_dead()

    def _replace_dead(self) -> None:
        with self._lock:
            for i, worker in enumerate(self.workers):
                if not worker.alive():
                    self.exits.append(
                        WorkerExit(worker.name, worker.pid, worker.process.returncode)
                    )
                    worker.close()
                    self.workers[i] = self._spawn()
                    self.restarts += 1

    def exit_mark(self) -> int:
        """A mark to pass to ``exits_since`` later."""
        self._replace_dead()
        return len(self.exits)

    def exits_since(self, mark: int) -> list[WorkerExit]:
        """Workers that exited since ``mark`` (checked now, not at the next poll)."""
        self._replace_dead()
        with self._lock:
            return self.exits[mark:]

    def pids(self) -> list[int]:
        """Pids of the current workers."""
        with self._lock:
            return [w.pid for w in self.workers]

    def by_pid(self, pid: int) -> WorkerProcess | None:
        """The live worker with this pid."""
        with self._lock:
            return next((w for w in self.workers if w.pid == pid and w.alive()), None)

    def kill_random(self, rng: random.Random) -> None:
        """SIGKILL one worker chosen at random (the supervisor brings up another)."""
        with self._lock:
            victim = rng.choice(self.workers)
        victim.kill()

    def stop(self) -> None:
        """Stop supervising, then stop every worker."""
        self._stop.set()
        self._thread.join()
        for worker in self.workers:
            worker.stop(timeout=10)


class Rig:
    """Everything one crash-matrix run needs; use ``open_rig()``."""

    def __init__(
        self, database_url: str, target: TargetProcess, contracts: Path, workdir: Path
    ) -> None:
        self.database_url = database_url
        self.target = target
        self.contracts = contracts
        self.workdir = workdir
        self.fp_dir = workdir / "failpoints"
        self.pool: WorkerPool | None = None
        #: The rig's own embedded server (None when DATABASE_URL names the server).
        self.embedded_project_dir: Path | None = None
        #: What each cell counted, to find the charges no cell did.
        self.claims = ChargeClaims()

    def env(self) -> dict[str, str]:
        """Environment of every broker child process of this rig."""
        return broker_env(
            self.database_url,
            self.contracts,
            settings.EFFECT_BROKER_MASTER_KEY,
            extra={"EFFECT_BROKER_FAILPOINT_DIR": str(self.fp_dir)},
        )

    def new_tenant(self, label: str) -> Tenant:
        """A tenant per cell: every cell can use the same operation key."""
        return create_tenant(f"{label}-{uuid.uuid4().hex[:6]}")[0]

    def arm(self, tenant: Tenant, failpoint: str, *, pause: float | None = None) -> None:
        """Arm ``failpoint`` for this tenant's charge."""
        failpoints.arm(
            self.fp_dir, f"{tenant.id}/{OPERATION_KEY}", failpoint, pause=pause
        )

    def fired(self, tenant: Tenant, failpoint: str) -> bool:
        """Whether the armed failpoint fired."""
        return failpoints.fired(self.fp_dir, f"{tenant.id}/{OPERATION_KEY}", failpoint)

    def submit(
        self,
        tenant: Tenant,
        scenario: str,
        body: dict[str, Any],
        *,
        operation_key: str = OPERATION_KEY,
    ) -> EffectRecord:
        """Submit in this process (the agent's call)."""
        request = EffectRequest(
            operation_key=operation_key, tool=TOOLS[scenario], arguments=body
        )
        return submit(tenant, request).effect

    def submit_in_child(self, tenant: Tenant, scenario: str, body: dict[str, Any]) -> int:
        """Submit through ``effect-broker submit`` in a child process; its exit code."""
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "effect_broker.cli",
                "submit",
                "--tenant",
                tenant.name,
                "--tool",
                TOOLS[scenario],
                "--operation-key",
                OPERATION_KEY,
                "--arguments",
                json.dumps(body),
            ],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            timeout=60,
            check=False,
        )
        return result.returncode

    def effect_of(
        self, tenant: Tenant, *, operation_key: str = OPERATION_KEY
    ) -> EffectRecord:
        """The tenant's charge as the ledger has it now."""
        return store.reads.get_effect_by_key(str(tenant.id), operation_key)

    def wait_settled(
        self,
        tenant: Tenant,
        scenario: str,
        timeout: float = 90,
        *,
        operation_key: str = OPERATION_KEY,
    ) -> EffectRecord:
        """Wait until the effect reaches a state only an operator could change."""

        def settled() -> EffectRecord | None:
            record = self.effect_of(tenant, operation_key=operation_key)
            if record.status in SETTLED:
                return record
            unsafe = safety_of(scenario) == "unsafe"
            if unsafe and record.status is EffectStatus.OUTCOME_UNKNOWN:
                return record  # unsafe + unknown waits for an operator, by design
            return None

        try:
            return wait_until(settled, timeout=timeout, interval=0.2, what="settlement")
        finally:
            connection.close()

    def target_effects(self, scenario: str, body: dict[str, Any], key: str = "") -> int:
        """Effects the target really applied for a broker effect, from its own table.

        Keyed modes count by the downstream key the broker sends (``key``): every
        charge under it is the effect's, whatever its body. Unsafe counts by body.
        """
        if scenario == "transactional":
            from effect_broker.adapters.simulated_adapter import local_effect_count

            return local_effect_count(key)
        mode = safety_of(scenario)  # an mcp-* cell charges the same target modes
        if mode in KEY_COLUMNS:
            self.claims.claim_key(mode, key, f"broker/{body.get('cell', '')}")
            return self.target.count_by_key(mode, key)
        return self.count_baseline(mode, body)

    def count_baseline(self, mode: str, body: dict[str, Any]) -> int:
        """Target charges of ``mode`` with exactly ``body`` (claimed for its cell)."""
        self.claims.claim_body(mode, body, str(body.get("cell", "")))
        return self.target.count_by_body(body)

    def unattributed(self) -> list[Charge]:
        """Charges in the target's table that no count of this run claimed."""
        return self.claims.unattributed(self.target.charges())

    def crash_database(self, down_seconds: float) -> float:
        """SIGKILL the rig's PostgreSQL postmaster, keep it down ``down_seconds``, and
        start it again (crash recovery, as after a power cut); return the monotonic
        time it answered again. Needs the rig's own embedded server."""
        assert self.embedded_project_dir is not None
        server = embedded_pg.status(self.embedded_project_dir)
        if server is None or server.pid is None:
            raise RuntimeError("the rig's embedded PostgreSQL server is not running")
        os.kill(server.pid, signal.SIGKILL)
        time.sleep(down_seconds)
        # Reaps the orphaned backends, then starts the server; it recovers first.
        embedded_pg.ensure_running(self.embedded_project_dir)
        return time.monotonic()

    def restart_target(self, port: int) -> None:
        """Bring the target back on the same port (its table survives in Postgres)."""
        self.target = start_target(
            self.database_url,
            settlement_delay="500ms",
            key_retention="24h",
            schema="crash_target",
            port=port,
        )

    def naive_local_effects(self, operation_key: str) -> int:
        """Charges the naive loop wrote in its 'transactional' mode."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM naive.local_charges WHERE operation_key = %s",
                [operation_key],
            ).fetchone()
        return int(row[0]) if row else 0

    def receipts(self, record: EffectRecord) -> int:
        """Receipts the broker holds for the effect."""
        return EffectReceipt.objects.filter(effect_id=record.effect_id).count()

    def stale_writes(self, record: EffectRecord) -> int:
        """Writes the fence refused for the effect."""
        return StaleWrite.objects.filter(effect_id=record.effect_id).count()

    def run_baseline(
        self, module: str, args: list[str], failpoint: str, *, timeout: float
    ) -> None:
        """Run a baseline's runner process until it exits 0, as its agent would retry
        it: the first run is killed at ``failpoint``, at most two more follow."""
        for attempt in range(3):
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    module,
                    "--database-url",
                    self.database_url,
                    "--target",
                    self.target.url,
                    *args,
                    "--failpoint",
                    failpoint if attempt == 0 else "",
                ],
                cwd=ROOT,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            if result.returncode == 0:
                return

    def run_naive(
        self, scenario: str, body: dict[str, Any], key: str, failpoint: str
    ) -> int:
        """Run the naive loop until it records success (a crash means run it again)."""
        self.run_baseline(
            "examples.crash_matrix.naive_runner",
            ["--mode", scenario, "--operation-key", key, "--body", json.dumps(body)],
            failpoint,
            timeout=60,
        )
        if scenario == "transactional":
            return self.naive_local_effects(key)
        return self.count_baseline(scenario, body)


def create_scratch_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_scratch_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)
            )
        )


def _use_own_embedded_server(name: str = "crash-matrix") -> Path | None:
    """Point Django at an embedded server of the rig's own, if embedded is in use.

    The matrix restarts its database server on purpose; doing that to the shared
    development server would break every other process using it. ``name`` picks the
    instance (the benchmark uses its own, so its load never lands on the matrix's).
    """
    if connection.settings_dict["ENGINE"] != "effect_broker.embedded_db":
        return None
    from effect_broker import embedded_pg

    # Under STATE_DIR, not BASE_DIR: an installed package's BASE_DIR is site-packages,
    # and EFFECT_BROKER_STATE_DIR gives a second run a server of its own.
    project_dir = Path(settings.STATE_DIR) / ".effect-broker" / name
    project_dir.mkdir(parents=True, exist_ok=True)
    server = embedded_pg.ensure_running(project_dir)
    connections.close_all()
    # Host and port too: child processes get this entry as DATABASE_URL.
    connection.settings_dict.update(
        {
            "EMBEDDED_PROJECT_DIR": str(project_dir),
            "HOST": server.host,
            "PORT": str(server.port),
        }
    )
    return project_dir


@contextmanager
def open_rig(*, workers: int = 3, keep_database: bool = False) -> Iterator[Rig]:
    """Create a scratch database, migrate it, start the target and the workers."""
    own_server = _use_own_embedded_server()
    connection.ensure_connection()  # starts the embedded server when that is in use
    admin_url = url_from_settings(connection.settings_dict)
    scratch = f"eb_crash_matrix_{os.getpid()}"
    create_scratch_database(admin_url, scratch)
    # From here on every Django connection of this process uses the scratch database.
    connections.close_all()
    connection.settings_dict["NAME"] = scratch
    workdir = Path(tempfile.mkdtemp(prefix="eb-crash-matrix-"))
    target: TargetProcess | None = None
    rig: Rig | None = None
    try:
        call_command("migrate", verbosity=0, interactive=False)
        database_url = url_from_settings(connection.settings_dict)
        ensure_schema(database_url)
        target = start_target(
            database_url,
            settlement_delay="500ms",
            key_retention="24h",
            schema="crash_target",
        )
        contracts = write_contracts(
            workdir / "contracts.toml", target.url, settlement_bound="1s", timeout="10s"
        )
        runtime.reset()
        with runtime.override(registry=load_contracts(contracts)):
            rig = Rig(database_url, target, contracts, workdir)
            rig.embedded_project_dir = own_server
            rig.pool = WorkerPool(rig.env(), workers)
            yield rig
    finally:
        if rig is not None and rig.pool is not None:
            rig.pool.stop()
        # The target may have been restarted (target-down cells): stop the live one.
        live = rig.target if rig is not None else target
        if live is not None:
            live.stop()
        runtime.reset()
        connections.close_all()
        if not keep_database:
            drop_scratch_database(admin_url, scratch)
        if own_server is not None:
            from effect_broker import embedded_pg

            embedded_pg.stop(own_server)


def pause_until(deadline: float) -> None:
    """Sleep until a monotonic deadline (no-op when it has passed)."""
    time.sleep(max(0.0, deadline - time.monotonic()))
