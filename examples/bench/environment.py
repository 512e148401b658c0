"""Where the bench runs: its own scratch database, worker processes, the HTTP target,
and a description of the machine and the server's durability settings.

The scratch database lives on the bench's own embedded server (or, with DATABASE_URL,
on that server): a 1M-row seed and saturated workers must never land on the shared
development server other processes are using. The crash matrix's helpers do the
pointing and the scratch-database bookkeeping; the bench reuses them.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from django.core.management import call_command
from django.db import connection, connections

from config.database import url_from_settings
from effect_broker.services.runtime import get_runtime
from examples.crash_matrix.contracts import contracts_toml
from examples.crash_matrix.rig import (
    _use_own_embedded_server,
    create_scratch_database,
    drop_scratch_database,
)
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import ROOT, WorkerProcess, broker_env, wait_until

#: Production timing for bench workers (broker_env's defaults are the crash matrix's
#: fast-recovery values, whose 1 s sweeps would add load that a deployment has not).
#: Workers keep their database connections between jobs in the workers' pool
#: (config/capacity.py), as docker-compose.yml's do.
PRODUCTION_TIMING = {
    "EFFECT_BROKER_LEASE_SECONDS": "30",
    "EFFECT_BROKER_HEARTBEAT_SECONDS": "10",
    "EFFECT_BROKER_SWEEP_SECONDS": "5",
    "EFFECT_BROKER_STALLED_JOB_SECONDS": "30",
    "EFFECT_BROKER_REDEFER_GRACE_SECONDS": "10",
    # The bench reads bare jobs' rows and events after they succeed (pipeline.py):
    # pinned, so a retention of 0 in the caller's environment cannot delete them first.
    "EFFECT_BROKER_JOB_RETENTION_HOURS": "24",
}
#: The simulated (in-process) target the end-to-end cases dispatch to.
SIMULATED_TOOL = "bench_charge"
SIMULATED_CONTRACT = f"""
[[contract]]
name = "bench.charge"
version = "1"
tool = "{SIMULATED_TOOL}"
safety = "idempotent"
description = "In-process simulated target: the broker's own cost, no network."
retry_limit = 5
key_retention = "24h"
adapter = "simulated"
preview_fields = ["order", "amount_minor", "currency"]
"""
#: Declared settlement bound of the HTTP target used for reconciliation latency.
SETTLEMENT = "100ms"


@dataclass(frozen=True)
class BenchDatabase:
    """The scratch database every case of one run uses."""

    url: str
    name: str
    where: str
    #: A database on the same server to create and drop siblings from.
    admin_url: str


@contextmanager
def scratch_database() -> Iterator[BenchDatabase]:
    """Create, migrate, yield and finally drop the bench's scratch database."""
    own_server = _use_own_embedded_server("bench")
    where = (
        "embedded server (own instance, .effect-broker/bench)"
        if own_server is not None
        else "DATABASE_URL server"
    )
    try:
        connection.ensure_connection()  # starts the embedded server when in use
        admin_url = url_from_settings(connection.settings_dict)
        name = f"eb_bench_{os.getpid()}"
        create_scratch_database(admin_url, name)
        connections.close_all()
        original_name = connection.settings_dict["NAME"]
        connection.settings_dict["NAME"] = name
        try:
            call_command("migrate", verbosity=0, interactive=False)
            url = url_from_settings(connection.settings_dict)
            yield BenchDatabase(url, name, where, admin_url)
        finally:
            connections.close_all()
            drop_scratch_database(admin_url, name)
            # A later scratch database (--with-soak's) starts from the same server.
            connection.settings_dict["NAME"] = original_name
    finally:
        if own_server is not None:
            from effect_broker import embedded_pg

            embedded_pg.stop(own_server)


def use_database(name: str) -> None:
    """Point this process's Django connections at database ``name`` (same server)."""
    connections.close_all()
    connection.settings_dict["NAME"] = name


@contextmanager
def sibling_database(db: BenchDatabase, suffix: str) -> Iterator[str]:
    """Another migrated scratch database next to ``db`` (a second ledger, so two
    ledger sizes can be measured turn about); dropped on exit. Leaves Django on
    ``db``."""
    name = f"{db.name}_{suffix}"
    create_scratch_database(db.admin_url, name)
    try:
        use_database(name)
        call_command("migrate", verbosity=0, interactive=False)
        use_database(db.name)
        yield name
    finally:
        use_database(db.name)
        drop_scratch_database(db.admin_url, name)


def server_settings(database_url: str) -> dict[str, str]:
    """The server settings that decide what a commit costs (printed with every table)."""
    names = (
        "server_version",
        "fsync",
        "synchronous_commit",
        "wal_sync_method",
        "full_page_writes",
        "shared_buffers",
        "max_connections",
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        return {
            name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in names
        }


def machine() -> dict[str, Any]:
    """nproc, CPU model, RAM and OS of this machine."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "unknown"
    ram_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gb": ram_gb,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average_at_start": list(os.getloadavg()),
    }


class Services:
    """The HTTP target and the contract file every bench process loads."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.workdir = Path(tempfile.mkdtemp(prefix="eb-bench-"))
        self.target: TargetProcess = start_target(
            database_url,
            settlement_delay=SETTLEMENT,
            key_retention="24h",
            schema="bench_target",
        )
        self.contracts = self.workdir / "contracts.toml"
        self.contracts.write_text(
            SIMULATED_CONTRACT
            + contracts_toml(self.target.url, settlement_bound=SETTLEMENT, timeout="10s"),
            encoding="utf-8",
        )

    def worker_env(self, *, pooled: bool = True) -> dict[str, str]:
        """Environment of a bench worker: production timing, the no-op task loaded;
        ``pooled=False``: no pool, a new database connection per job."""
        connections_env = (
            {}
            if pooled
            else {
                "EFFECT_BROKER_WORKER_DB_POOL_MAX_SIZE": "0",
                "EFFECT_BROKER_DB_CONN_MAX_AGE": "0",
            }
        )
        return broker_env(
            self.database_url,
            self.contracts,
            get_runtime().master_key,
            extra={
                **PRODUCTION_TIMING,
                # What production runs: DEBUG on would log and keep every query.
                "DEBUG": "0",
                **connections_env,
                "DJANGO_SETTINGS_MODULE": "examples.bench.worker_settings",
            },
        )

    def close(self) -> None:
        """Stop the target and remove the contract file."""
        self.target.stop()
        for path in self.workdir.iterdir():
            path.unlink()
        self.workdir.rmdir()


def _registered_workers(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()
    return int(row[0]) if row else 0


@contextmanager
def running_workers(
    services: Services, count: int, *, pooled: bool = True
) -> Iterator[list[WorkerProcess]]:
    """``count`` real worker processes (concurrency 1 each), ready when yielded."""
    before = _registered_workers(services.database_url)
    env = services.worker_env(pooled=pooled)
    workers = [WorkerProcess(f"bench-w{i + 1}", env, concurrency=1) for i in range(count)]
    try:

        def ready() -> bool:
            for worker in workers:
                if not worker.alive():
                    raise RuntimeError(
                        f"worker {worker.name} exited during start-up:\n"
                        + worker.log_tail()
                    )
            return _registered_workers(services.database_url) >= before + count

        wait_until(ready, timeout=60, interval=0.1, what=f"{count} workers to start")
        time.sleep(0.3)  # let each worker finish its first (empty) fetch
        yield workers
    finally:
        for worker in workers:
            worker.stop(timeout=15)


__all__ = [
    "ROOT",
    "SIMULATED_TOOL",
    "BenchDatabase",
    "Services",
    "machine",
    "running_workers",
    "scratch_database",
    "server_settings",
    "sibling_database",
    "use_database",
]
