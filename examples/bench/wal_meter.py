"""Counting commits and WAL per effect (issue 13): the windows, and how they count.

Counted by the server, not estimated: ``pg_stat_database`` (``xact_commit``,
``xact_rollback`` of the scratch database), the WAL insert position (bytes: exact,
cluster-wide, and the bench's embedded server serves no one else), ``pg_stat_wal``
(``wal_records``, ``wal_fpi``, and its ``wal_bytes`` as a cross-check) and, when
``pg_waldump`` can read the server's pg_wal, its ``--stats`` between the window's
two positions (bytes per resource manager: heap, btree, commit records, full-page
images). Each window runs alone, on a quiet ledger:

- submit: the service-level submit of N new effects, no worker running;
- dispatch: one worker process started on those N queued effects, drained, stopped;
- defer / jobs: N bare no-op procrastinate jobs deferred, then drained the same way;
- idle: a worker started, left idle for 1 s and for 1 + ``idle_seconds`` s, stopped.

A window that runs a worker also pays the worker's start and stop (registering,
unregistering, first fetch) and its background (polls, heartbeats, the sweeper) for
as long as it ran. The two idle windows give both: their difference is the
background per second, their intercept the start-and-stop cost, and both are
subtracted from the drain windows. What is left per item is the work one effect (or
one job) costs; the broker's own claim + outcome statements are the dispatch window
less the bare job's fetch + finish.

Why windows end with the worker stopped: a backend reports its counters to the
cumulative statistics at most once a second, and an idle one up to 10 s later; a
backend that exits reports at once. This process's own connection is made to
report with ``pg_stat_force_next_flush()`` (one commit, subtracted), and the
counters are read from a connection to another database, so reading them adds
nothing to the scratch database's count. Before the first window, one worker is
started and stopped unmeasured, so no window pays what earlier phases left pending
(and first-touch costs of a fresh database).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from django.db import connection

from examples.bench.broker_cases import BrokerCases
from examples.bench.environment import BenchDatabase, Services, running_workers
from examples.bench.http_servers import postmaster_pid, process_cpu, process_tree_cpu
from examples.bench.noop_task import noop
from examples.bench.wal_commits import Counters, WalCommits, Window

POLL_SECONDS = 0.05
#: The tables whose rows an effect or a job writes (their indexes are counted).
TABLES = (
    "effect_intents",
    "effect_events",
    "effect_attempts",
    "effect_receipts",
    "procrastinate_jobs",
    "procrastinate_events",
    "procrastinate_workers",
)


def _changed(
    before: dict[str, tuple[int, int, int, int]],
    after: dict[str, tuple[int, int, int, int]],
) -> dict[str, tuple[int, int, int, int]]:
    """Tables whose row counters moved between two reads, and by how much."""
    moved = {}
    for table, now in after.items():
        was = before.get(table, (0, 0, 0, 0))
        delta = (now[0] - was[0], now[1] - was[1], now[2] - was[2], now[3] - was[3])
        if any(delta):
            moved[table] = delta
    return moved


def _analysed(w: Window) -> bool:
    """An autoanalyze ran in the window (it wrote pg_statistic)."""
    return any(w.rows.get("pg_statistic", ()))


class Meter:
    """Reads the counters from a connection to another database on the same server."""

    def __init__(self, db: BenchDatabase) -> None:
        self.db = db
        self._admin = psycopg.connect(db.admin_url, autocommit=True)
        #: A connection to the scratch database: polls and table counters.
        self._scratch = psycopg.connect(db.url, autocommit=True)
        self.polls = 0
        row = self._admin.execute("SHOW data_directory").fetchone()
        self._wal_dir = Path(str(row[0])) / "pg_wal" if row else None
        self._postmaster = postmaster_pid(db.admin_url)

    def server_cpu(self) -> float:
        """CPU seconds of the server's process tree so far (NaN: not on this machine)."""
        return (
            math.nan if self._postmaster is None else process_tree_cpu(self._postmaster)
        )

    def close(self) -> None:
        """Close both connections."""
        self._admin.close()
        self._scratch.close()

    def read(self) -> Counters:
        """The counters now (a fresh snapshot, not the transaction's cached one),
        once the WAL inserted so far is on disk (pg_waldump reads only that)."""
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            row = self._admin.execute(
                "SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()"
            ).fetchone()
            if row and row[0]:
                break
            time.sleep(0.02)  # the WAL writer flushes every wal_writer_delay
        self._admin.execute("SELECT pg_stat_clear_snapshot()")
        row = self._admin.execute(
            "SELECT d.xact_commit, d.xact_rollback, "
            "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, "
            "w.wal_records, w.wal_fpi, w.wal_bytes, pg_current_wal_insert_lsn()::text "
            "FROM pg_stat_database d, pg_stat_wal w WHERE d.datname = %s",
            [self.db.name],
        ).fetchone()
        assert row is not None
        commits, rollbacks, position, records, fpi, stat_bytes = map(int, row[:6])
        return Counters(
            commits, rollbacks, position, records, fpi, stat_bytes, lsn=str(row[6])
        )

    def backends(self) -> int:
        """Backends connected to the scratch database."""
        row = self._admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [self.db.name]
        ).fetchone()
        return int(row[0]) if row else 0

    def rows(self) -> dict[str, tuple[int, int, int, int]]:
        """Rows inserted, updated, HOT-updated, deleted so far, per table, catalogs
        included (an autoanalyze writes pg_statistic) (one commit
        of the scratch connection, flushed before it returns; read between windows)."""
        found = self._scratch.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
            "FROM pg_stat_all_tables, pg_stat_force_next_flush()"
        ).fetchall()
        return {str(r[0]): (int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in found}

    def indexes(self) -> dict[str, int]:
        """Indexes per table: each is one more WAL record per inserted row (and per
        non-HOT update)."""
        found = self._scratch.execute(
            "SELECT c.relname, count(i.indexrelid) FROM pg_class c "
            "LEFT JOIN pg_index i ON i.indrelid = c.oid "
            "WHERE c.relname = ANY(%s) AND c.relkind IN ('r', 'p') GROUP BY c.relname",
            [list(TABLES)],
        ).fetchall()
        return {str(r[0]): int(r[1]) for r in sorted(found)}

    def wait_for(self, query: str, params: Any, want: int, timeout: float = 300) -> None:
        """Poll the scratch database until ``query`` counts ``want``; each poll is one
        commit there, counted in ``polls``."""
        deadline = time.monotonic() + timeout
        while True:
            self.polls += 1
            row = self._scratch.execute(query, params).fetchone()
            if row is not None and int(row[0]) >= want:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {row[0] if row else 0} of {want} items done")
            time.sleep(POLL_SECONDS)

    def flush_polls(self) -> int:
        """Report the poll connection's commits now; return the commits it made in
        this window (its polls and this flush)."""
        self._scratch.execute("SELECT pg_stat_force_next_flush()")
        made, self.polls = self.polls + 1, 0
        return made

    def settle(self, baseline: int, timeout: float = 10) -> None:
        """Wait until the worker's backends have exited (and so reported)."""
        deadline = time.monotonic() + timeout
        while self.backends() > baseline and time.monotonic() < deadline:
            time.sleep(0.05)

    def waldump(self, start: str, end: str) -> dict[str, tuple[int, int, int]]:
        """pg_waldump --stats between two LSNs, per resource manager; {} when the
        tool or the WAL files are out of reach."""
        tool = _waldump_binary()
        if tool is None or self._wal_dir is None or not self._wal_dir.is_dir():
            return {}
        try:
            out = subprocess.run(
                [tool, "-p", str(self._wal_dir), "-s", start, "-e", end, "--stats"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return {}
        return parse_waldump_stats(out)


def _waldump_binary() -> str | None:
    from effect_broker import embedded_pg

    try:
        tool = embedded_pg._find_install() / "bin" / "pg_waldump"
    except embedded_pg.EmbeddedPostgresError:  # no wheel: one on PATH, or none
        return shutil.which("pg_waldump")
    return str(tool) if tool.is_file() else shutil.which("pg_waldump")


_STATS_LINE = re.compile(
    r"^(\w+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)"
)


def parse_waldump_stats(text: str) -> dict[str, tuple[int, int, int]]:
    """``pg_waldump --stats`` lines -> {rmgr: (records, record bytes, FPI bytes)}."""
    found: dict[str, tuple[int, int, int]] = {}
    for line in text.splitlines():
        match = _STATS_LINE.match(line.strip())
        if match and match.group(1) != "Total":
            name, n, rec, fpi = match.groups()
            if int(n):
                found[name] = (int(n), int(rec), int(fpi))
    return found


class WalCommitsPhase:
    """Runs the windows on the bench's scratch database."""

    def __init__(self, db: BenchDatabase, services: Services, cases: BrokerCases) -> None:
        self.services = services
        self.cases = cases
        self.meter = Meter(db)
        self.worker_cpu = 0.0
        #: The most connections one worker process held (sampled as a window ends).
        self.worker_connections = 0

    @contextmanager
    def window(self, result: WalCommits, name: str, items: int) -> Iterator[None]:
        """Measure what runs inside as window ``name``."""
        meter = self.meter
        rows_before = meter.rows()
        before = meter.read()
        cpu_before = meter.server_cpu()
        started = time.monotonic()
        self.worker_cpu = 0.0
        yield
        seconds = time.monotonic() - started
        pg_cpu = meter.server_cpu() - cpu_before
        own = meter.flush_polls()
        # This process's Django connection (submit, defer) reports now.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        own += 1
        after = meter.read()
        rows_after = meter.rows()
        meter.polls = 0
        window = Window(
            name,
            items,
            seconds,
            after - before,
            own,
            _changed(rows_before, rows_after),
            meter.waldump(before.lsn, after.lsn),
            pg_cpu,
            self.worker_cpu,
        )
        result.windows[name] = window

    def _worker(self, until: Callable[[], None]) -> None:
        """Start one worker, wait for ``until``, stop it, wait until its backends
        have gone (a backend reports its counters when it exits)."""
        baseline = self.meter.backends()
        with running_workers(self.services, 1) as (worker,):
            ready = process_cpu(worker.pid)
            until()
            self.worker_cpu = process_cpu(worker.pid) - ready
            held = self.meter.backends() - baseline
            self.worker_connections = max(self.worker_connections, held)
        self.meter.settle(baseline)

    def _idle(self, result: WalCommits, name: str, seconds: float) -> None:
        """An idle window, measured again (up to twice) when it met an autoanalyze:
        rewriting pg_statistic costs tens of kB of WAL and a few commits that are
        nobody's idle background (catalogs churned by worker start-up get analysed
        too, and autovacuum cannot be turned off for them from here)."""
        for tries in range(3):
            with self.window(result, name, 0):
                self._worker(lambda: time.sleep(seconds))
            if not _analysed(result.windows[name]):
                return
            result.notes.append(
                f"{name}, try {tries + 1}: met an autoanalyze, measured again"
            )

    def run(self, items: int, idle_seconds: float) -> WalCommits:
        """All windows, in an order where none leaves work for the next."""
        meter = self.meter
        server = {
            name: str(meter._admin.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in (
                "fsync",
                "synchronous_commit",
                "full_page_writes",
                "wal_compression",
                "data_checksums",
                "checkpoint_timeout",
            )
        }
        result = WalCommits(items, idle_seconds, server, meter.indexes())
        self._idle(result, "idle_short", 1.0)
        self._idle(result, "idle_long", 1.0 + idle_seconds)

        with self.window(result, "defer", items):
            base = 900_000_000 + int(time.time()) % 1000 * 100_000
            jobs = [int(noop.defer(n=base + i)) for i in range(items)]
        with self.window(result, "jobs", items):
            self._worker(
                lambda: meter.wait_for(
                    "SELECT count(*) FROM procrastinate_jobs "
                    "WHERE id = ANY(%s) AND status = 'succeeded'",
                    [jobs],
                    items,
                )
            )

        with self.window(result, "submit", items):
            effects = [
                self.cases.submit_new_series("walcommits", i).effect_id
                for i in range(items)
            ]
        with self.window(result, "dispatch", items):
            self._worker(
                lambda: meter.wait_for(
                    "SELECT count(*) FROM effect_receipts "
                    "WHERE effect_id = ANY(%s::uuid[])",
                    [effects],
                    items,
                )
            )
        result.worker_connections = self.worker_connections
        for name in ("defer", "jobs", "submit", "dispatch"):
            if _analysed(result.windows[name]):
                result.notes.append(f"{name} met an autoanalyze: its WAL includes it")
        if not any(w.waldump for w in result.windows.values()):
            result.notes.append("pg_waldump was not run (tool or pg_wal out of reach)")
        return result

    def close(self) -> None:
        """Close the meter's connections."""
        self.meter.close()


def idle_seconds(items: int, *, quick: bool) -> float:
    """How much longer the long idle window runs than the short one: 20 s, 10 s with
    --quick, and as little as 2 s for the few items of a smoke run, whose drains are
    as short (the background per second is then read off a short window)."""
    return min(10.0 if quick else 20.0, max(2.0, items / 4))


def measure(
    db: BenchDatabase, services: Services, cases: BrokerCases, *, items: int, quick: bool
) -> WalCommits:
    """Vacuum what earlier phases wrote (so autovacuum does not wake up inside a
    window), then run every window."""
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute("DELETE FROM procrastinate_jobs WHERE status = 'todo'")
        conn.execute("VACUUM (ANALYZE) " + ", ".join(TABLES))
        # Autovacuum and autoanalyze write WAL on their own schedule (an analyze
        # rewrites pg_statistic rows): off while the windows run, or a window that
        # meets one would charge its bytes to whatever ran then. Their cost is real
        # but is not per effect; docs/scaling.md says so.
        _autovacuum(conn, enabled=False)
    # This process's connection reports what earlier phases left pending.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    phase = WalCommitsPhase(db, services, cases)
    try:
        phase._worker(lambda: time.sleep(1))  # unmeasured: see the module docstring
        result = phase.run(items, idle_seconds=idle_seconds(items, quick=quick))
    finally:
        phase.close()
        with psycopg.connect(db.url, autocommit=True) as conn:
            _autovacuum(conn, enabled=True)
    result.notes.append("autovacuum was off on these tables while the windows ran")
    return result


def _autovacuum(conn: psycopg.Connection[Any], *, enabled: bool) -> None:
    for table in TABLES:
        if enabled:
            conn.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
        else:
            conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
