"""``effect-broker bench --soak N``: N effects through 2 real worker processes while one
is SIGKILLed and restarted every few seconds (a seeded schedule).

What it shows: latency over time (submit, claim and submit → receipt per window of
effects), how the ledger and job tables grow, worker RSS, and that no effect is lost
or duplicated at the target. The soak submits the idempotent HTTP charge: a kill
mid-send leaves the effect outcome_unknown, and the contract (the target's
Idempotency-Key) settles it by re-sending with the same key, so a kill costs latency,
never a second charge and never an unknown left for an operator. Every effect that
passed through outcome_unknown is counted and printed.

Workers run with the crash matrix's fast-recovery timing (3 s lease, 1 s sweep), so a
killed effect converges in seconds rather than after a 30 s lease.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from effect_broker.domain.states import TERMINAL_STATUSES
from effect_broker.services.submission import submit
from examples.bench.broker_cases import BrokerCases
from examples.bench.environment import Services, _registered_workers
from examples.bench.soak_options import SoakOptions
from examples.bench.soak_report import (
    TABLES,
    SoakResult,
    SoakWindow,
    summarize,
    window_line,
)
from examples.crash_matrix.contracts import TOOLS
from examples.crash_matrix.workers import FAST_RECOVERY, WorkerProcess, wait_until

Say = Callable[[str], None]
TOOL = TOOLS["idempotent"]
TARGET_MODE = "idempotent"
#: Worker settings a soak passes on from its own environment (the job settings, job
#: retention among them once the broker has it), so a run can show the job tables with
#: and without it. Everything else EFFECT_BROKER_* is the bench's own (broker_env).
PASSED_ON_PREFIXES = ("EFFECT_BROKER_JOB_", "EFFECT_BROKER_FAILED_JOB_")
FINAL = [str(s) for s in TERMINAL_STATUSES]
#: Seconds between checks for finished windows (each check reads one window's rows).
CHECK_SECONDS = 1.0


@dataclass
class _Pending:
    """A window submitted but not yet final."""

    index: int
    ids: list[str] = field(default_factory=list)
    submit_seconds: list[float] = field(default_factory=list)
    submitted_at: float = 0.0


class _Workers:
    """Two worker processes; ``kill_one`` SIGKILLs the second and starts a new one.

    Only the second is ever killed: the first lives through the whole soak, so its
    RSS over the windows shows whether a worker's memory grows with the effects it
    has run; the restarted one shows the cost of starting over.
    """

    def __init__(self, services: Services) -> None:
        extra = {k: v for k, v in os.environ.items() if k.startswith(PASSED_ON_PREFIXES)}
        # The broker's default keeps a succeeded job 24 h and removes finished jobs
        # hourly, which a half-hour soak cannot show. Retention 0 (procrastinate
        # deletes a job as it succeeds) shows bounded tables within the run; set
        # EFFECT_BROKER_JOB_RETENTION_HOURS to soak another value.
        extra.setdefault("EFFECT_BROKER_JOB_RETENTION_HOURS", "0")
        self.retention_env = extra
        env = services.worker_env()
        # Fast recovery instead of the bench's production timing: see the module doc.
        env.update(FAST_RECOVERY)
        env.update(extra)
        self._env = env
        self._url = services.database_url
        self.generation = 0
        before = _registered_workers(self._url)
        self.steady = WorkerProcess("soak-steady", env, concurrency=1)
        self.victim = self._start_victim()
        wait_until(
            lambda: _registered_workers(self._url) >= before + 2,
            timeout=60,
            interval=0.1,
            what="2 soak workers to start",
        )
        self.started = {self.steady.name: time.monotonic()}
        self.started[self.victim.name] = time.monotonic()

    def _start_victim(self) -> WorkerProcess:
        self.generation += 1
        name = f"soak-restarted-{self.generation}"
        return WorkerProcess(name, self._env, concurrency=1)

    def kill_one(self) -> None:
        """SIGKILL the restartable worker, as the OOM killer would; start another."""
        self.victim.kill()
        self.started.pop(self.victim.name, None)
        self.victim.close()
        self.victim = self._start_victim()
        self.started[self.victim.name] = time.monotonic()

    def check_alive(self) -> None:
        """A worker that died on its own is a finding: stop the soak with its log."""
        if not self.steady.alive():
            raise RuntimeError(
                "the steady soak worker exited:\n" + self.steady.log_tail()
            )

    def rss(self) -> dict[str, tuple[float, float]]:
        """name -> (RSS in MB from /proc, seconds since it started)."""
        out: dict[str, tuple[float, float]] = {}
        for worker in (self.steady, self.victim):
            try:
                with open(f"/proc/{worker.pid}/status", encoding="ascii") as status:
                    for line in status:
                        if line.startswith("VmRSS:"):
                            mb = int(line.split()[1]) / 1024
                            age = time.monotonic() - self.started[worker.name]
                            out["steady" if worker is self.steady else "restarted"] = (
                                mb,
                                age,
                            )
            except OSError:
                continue
        return out

    def close(self) -> None:
        """Stop both (SIGTERM, then SIGKILL)."""
        for worker in (self.steady, self.victim):
            worker.stop(timeout=15)


def _tables(db: psycopg.Connection) -> dict[str, tuple[int, int]]:
    out = {}
    for table in TABLES:
        row = db.execute(
            f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}"
        ).fetchone()
        out[table] = (int(row[0]), int(row[1])) if row else (0, 0)
    return out


def _queue(db: psycopg.Connection) -> int:
    row = db.execute(
        "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    ).fetchone()
    return int(row[0]) if row else 0


def _final_count(db: psycopg.Connection, ids: list[str]) -> int:
    row = db.execute(
        "SELECT count(*) FROM effect_intents WHERE id = ANY(%s::uuid[]) "
        "AND status = ANY(%s)",
        [ids, FINAL],
    ).fetchone()
    return int(row[0]) if row else 0


def _window_times(
    db: psycopg.Connection, ids: list[str]
) -> tuple[list[float], list[float]]:
    """(claim seconds, receipt seconds) of ``ids`` from database timestamps."""
    rows = db.execute(
        "SELECT extract(epoch FROM (SELECT min(a.started_at) FROM effect_attempts a "
        "WHERE a.effect_id = i.id) - i.created_at), "
        "extract(epoch FROM r.created_at - i.created_at) "
        "FROM effect_intents i LEFT JOIN effect_receipts r ON r.effect_id = i.id "
        "WHERE i.id = ANY(%s::uuid[])",
        [ids],
    ).fetchall()
    claims = [float(c) for c, _ in rows if c is not None]
    receipts = [float(r) for _, r in rows if r is not None]
    return claims, receipts


class Soak:
    """One soak: submit at a steady rate, kill on schedule, report each window."""

    def __init__(
        self, opts: SoakOptions, services: Services, cases: BrokerCases, say: Say
    ) -> None:
        self.opts = opts
        self.services = services
        self.cases = cases
        self.say = say
        self.db = psycopg.connect(services.database_url, autocommit=True)
        self.result = SoakResult(
            options=opts.to_json(),
            contract=f"{TOOL}: idempotent HTTP target, Idempotency-Key",
        )
        self.rng = random.Random(opts.seed)  # noqa: S311 - a schedule, not a secret
        self.pending: list[_Pending] = []
        self.all_ids: list[str] = []
        #: Effects in windows already reported.
        self.reported = 0
        self._start = time.monotonic()

    def _next_kill(self, now: float) -> float:
        if self.opts.kill_seconds <= 0:
            return float("inf")
        return now + self.rng.uniform(0.5, 1.5) * self.opts.kill_seconds

    def run(self) -> SoakResult:
        """Submit every effect, then wait for the last window; return the figures."""
        workers = _Workers(self.services)
        self.result.retention_env = dict(workers.retention_env)
        try:
            self._submit_all(workers)
            self._drain(workers)
            self._final(workers)
        finally:
            workers.close()
            self.db.close()
        return self.result

    def _submit_all(self, workers: _Workers) -> None:
        opts = self.opts
        start = self._start = time.monotonic()
        next_kill = self._next_kill(start)
        next_check = start + CHECK_SECONDS
        window = _Pending(0)
        backlog_waits = 0.0
        #: Seconds the schedule moved on for pauses: after one the submitter resumes its
        #: pace instead of bursting to catch up with the effects it did not submit.
        shift = 0.0
        for i in range(opts.effects):
            due = start + shift + i / opts.rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            now = time.monotonic()
            if now >= next_kill:
                workers.kill_one()
                self.result.kills += 1
                next_kill = self._next_kill(now)
            if now >= next_check:
                workers.check_alive()
                self._report_finished(workers, start)
                waited = time.monotonic()
                while self._unfinished(window) > opts.max_backlog:
                    time.sleep(CHECK_SECONDS)
                    self._report_finished(workers, start)
                backlog_waits += time.monotonic() - waited
                shift += max(0.0, time.monotonic() - due)
                next_check = time.monotonic() + CHECK_SECONDS
            request = self.cases.request(self.cases.key("soak", i))
            t0 = time.perf_counter()
            record = submit(self.cases.tenant, request).effect
            window.submit_seconds.append(time.perf_counter() - t0)
            window.ids.append(record.effect_id)
            self.all_ids.append(record.effect_id)
            if len(window.ids) == opts.window or i == opts.effects - 1:
                window.submitted_at = time.monotonic() - start
                self.pending.append(window)
                window = _Pending(window.index + 1)
        self.result.submitted = len(self.all_ids)
        if backlog_waits > 1:
            self.result.notes.append(
                f"the submitter paused {backlog_waits:.0f} s in all while more than "
                f"{opts.max_backlog:,} effects were unfinished (the workers could not "
                f"keep up with {opts.rate:g}/s)"
            )

    def _unfinished(self, current: _Pending) -> int:
        """Effects submitted but not yet final (queries only when it may matter)."""
        unreported = len(self.all_ids) - self.reported
        if unreported <= self.opts.max_backlog:
            return unreported
        return sum(
            len(w.ids) - _final_count(self.db, w.ids) for w in [*self.pending, current]
        )

    def _report_finished(self, workers: _Workers, start: float) -> None:
        """Report the oldest pending windows whose effects are all final."""
        while self.pending and _final_count(self.db, self.pending[0].ids) == len(
            self.pending[0].ids
        ):
            w = self.pending.pop(0)
            claims, receipts = _window_times(self.db, w.ids)
            submit_med, submit_p99 = summarize(w.submit_seconds)
            claim_med, claim_p99 = summarize(claims)
            receipt_med, receipt_p99 = summarize(receipts)
            tables = _tables(self.db)
            jobs = tables["procrastinate_jobs"][0]
            self.result.jobs_max = max(self.result.jobs_max, jobs)
            done = SoakWindow(
                index=w.index,
                effects=len(w.ids),
                submitted_at=w.submitted_at,
                submit_median=submit_med,
                submit_p99=submit_p99,
                claim_median=claim_med,
                claim_p99=claim_p99,
                receipt_median=receipt_med,
                receipt_p99=receipt_p99,
                kills=self.result.kills,
                tables=tables,
                rss_mb=workers.rss(),
                queue=_queue(self.db),
                reported_at=time.monotonic() - start,
            )
            self.result.windows.append(done)
            self.reported += len(w.ids)
            self.say(window_line(done))

    def _drain(self, workers: _Workers) -> None:
        """Wait for the last windows (kills stop: the soak is over)."""
        deadline = time.monotonic() + 120 + self.opts.effects / 50
        while self.pending and time.monotonic() < deadline:
            workers.check_alive()
            self._report_finished(workers, self._start)
            if self.pending:
                time.sleep(CHECK_SECONDS)
        self.result.seconds = time.monotonic() - self._start
        if self.pending:
            left = sum(len(w.ids) - _final_count(self.db, w.ids) for w in self.pending)
            self.result.notes.append(
                f"{left:,} effects were not final when the soak stopped waiting; "
                "they are counted as lost below"
            )

    def _final(self, workers: _Workers) -> None:
        r = self.result
        ids = self.all_ids
        rows = self.db.execute(
            "SELECT status, count(*) FROM effect_intents WHERE id = ANY(%s::uuid[]) "
            "GROUP BY status",
            [ids],
        ).fetchall()
        r.statuses = {str(s): int(n) for s, n in rows}
        final = sum(n for s, n in r.statuses.items() if s in FINAL)
        r.lost = len(ids) - final
        row = self.db.execute(
            "SELECT count(DISTINCT effect_id) FROM effect_events "
            "WHERE effect_id = ANY(%s::uuid[]) AND new_status = 'outcome_unknown'",
            [ids],
        ).fetchone()
        r.passed_outcome_unknown = int(row[0]) if row else 0
        schema = self.services.target.schema
        row = self.db.execute(
            f"SELECT count(*), count(DISTINCT idempotency_key) FROM {schema}.charges "
            "WHERE mode = %s",
            [TARGET_MODE],
        ).fetchone()
        r.target_rows, r.target_keys = (int(row[0]), int(row[1])) if row else (0, 0)
        r.jobs_end = _tables(self.db)["procrastinate_jobs"][0]
        r.jobs_max = max(r.jobs_max, r.jobs_end)


def run_soak(
    opts: SoakOptions, services: Services, cases: BrokerCases, say: Say
) -> SoakResult:
    """Run one soak and return what it measured."""
    kills = (
        f"a worker SIGKILLed about every {opts.kill_seconds:g} s"
        if opts.kill_seconds > 0
        else "no worker killed"
    )
    say(
        f"      {opts.effects:,} effects at up to {opts.rate:g}/s, windows of "
        f"{opts.window:,}, {kills}"
    )
    return Soak(opts, services, cases, say).run()
