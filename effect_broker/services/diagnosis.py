"""``doctor`` and ``/readyz``: is this deployment able to keep its promises right now?

Each check answers one question an operator would otherwise find out from an
incident (issue 11: a broken contract file turned every submit into a 500; a
SIGKILLed worker's effect sat in ``dispatching`` with no warning anywhere). A check
is ``ok``, ``warn`` (works, but look) or ``fail`` (something the broker promises is
not happening); ``skipped`` when a check it depends on failed.

The checks read; none of them writes a ledger row or sends anything to a target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from effect_broker.domain.errors import DecryptionError
from effect_broker.domain.payload_crypto import decrypt
from effect_broker.domain.states import EffectStatus

Status = Literal["ok", "warn", "fail", "skipped"]

#: Effects that wait for a person (spec "Operator resolution").
WAITING = (EffectStatus.OUTCOME_UNKNOWN.value, EffectStatus.MANUAL_REVIEW.value)


@dataclass(frozen=True)
class Check:
    """One answer: its status, one line for a person, and rows for a closer look."""

    name: str
    status: Status
    summary: str
    details: tuple[dict[str, Any], ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "name": self.name,
            "status": self.status,
            "summary": self.summary,
            "details": list(self.details),
        }


@dataclass(frozen=True)
class DoctorOptions:
    """Thresholds a deployment may tune from the command line."""

    #: An effect waiting for an operator longer than this fails the check.
    max_waiting_age: timedelta = timedelta(hours=1)
    #: How many of the newest effects the operation-key lint reads.
    lint_sample: int = 1000


def worker_timeout() -> float:
    """Seconds without a heartbeat after which a worker counts as dead: procrastinate's
    own ``stalled_worker_timeout`` (config/settings.py), so doctor, readiness and the
    sweeper that retries a dead worker's jobs agree."""
    return float(settings.PROCRASTINATE_WORKER_DEFAULTS["stalled_worker_timeout"])


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


# --- the database ---------------------------------------------------------------


def check_database() -> Check:
    """PostgreSQL answers."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT current_setting('server_version'), current_database()")
            version, name = cur.fetchone()
    except Exception as exc:  # any failure to reach it is the answer
        reason = " ".join(str(exc).split())  # libpq's message spans lines
        return Check("database", "fail", f"unreachable: {type(exc).__name__}: {reason}")
    return Check("database", "ok", f"PostgreSQL {version}, database {name}")


def check_migrations() -> Check:
    """Every migration this code ships is applied."""
    try:
        executor = MigrationExecutor(connection)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        return Check("migrations", "fail", f"cannot read: {type(exc).__name__}: {exc}")
    if plan:
        names = [f"{m.app_label}.{m.name}" for m, _ in plan]
        return Check(
            "migrations",
            "fail",
            f"{len(names)} not applied; run: effect-broker migrate",
            tuple({"migration": name} for name in names),
        )
    return Check("migrations", "ok", "all applied")


def check_procrastinate_schema() -> Check:
    """procrastinate's tables exist (its schema comes with ``migrate``)."""
    tables = ("procrastinate_jobs", "procrastinate_workers", "procrastinate_events")
    with connection.cursor() as cur:
        cur.execute(
            "SELECT t FROM unnest(%s::text[]) AS t WHERE to_regclass(t) IS NULL",
            [list(tables)],
        )
        missing = [row[0] for row in cur.fetchall()]
    if missing:
        return Check(
            "procrastinate_schema",
            "fail",
            f"missing {', '.join(missing)}; run: effect-broker migrate",
        )
    return Check("procrastinate_schema", "ok", "job tables present")


# --- keys and contracts ---------------------------------------------------------


def check_master_key() -> Check:
    """A master key is configured and it is the one the ledger was written with.

    The check value is the ledger itself: the newest and the oldest effect's
    arguments are AES-GCM ciphertexts whose key derives from a master key in the
    keyring (its id is stored with them), so they authenticate only under that same
    key (a wrong key fails the GCM tag; a key missing from the keyring is named). No
    extra fingerprint row is needed, and none can drift from the data it vouches for.
    """
    from effect_broker.services.runtime import configured_keyring
    from effect_broker.services.submission import arguments_aad

    keyring = configured_keyring()
    if keyring is None:
        return Check(
            "master_key",
            "fail",
            "not configured (EFFECT_BROKER_MASTER_KEY or EFFECT_BROKER_MASTER_KEY_FILE)",
        )
    with connection.cursor() as cur:
        # By id: time-ordered (v7) ids make both ends one primary-key index probe,
        # however large the ledger.
        cur.execute(
            "(SELECT id, tenant_id, operation_key, arguments_ciphertext, arguments_key_id"
            "   FROM effect_intents ORDER BY id DESC LIMIT 1)"
            " UNION "
            "(SELECT id, tenant_id, operation_key, arguments_ciphertext, arguments_key_id"
            "   FROM effect_intents ORDER BY id ASC LIMIT 1)"
        )
        rows = cur.fetchall()
    if not rows:
        return Check("master_key", "ok", "configured; no effect written yet to compare")
    bad = []
    for effect_id, tenant_id, operation_key, blob, key_id in rows:
        try:
            decrypt(
                keyring, key_id, blob, aad=arguments_aad(str(tenant_id), operation_key)
            )
        except DecryptionError as exc:
            bad.append({"effect_id": str(effect_id), "key_id": key_id, "error": str(exc)})
    if bad:
        return Check(
            "master_key",
            "fail",
            "the ledger was written with a different master key: stored arguments "
            "do not decrypt (workers cannot dispatch them)",
            tuple(bad),
        )
    return Check(
        "master_key", "ok", f"matches the ledger ({len(rows)} stored payload(s) decrypt)"
    )


def check_contracts() -> Check:
    """The configured contracts file is valid, adapter options included."""
    from effect_broker.services.contract_check import validate_file

    report = validate_file(settings.EFFECT_BROKER_CONTRACTS)
    if report.problems:
        return Check(
            "contracts",
            "fail",
            f"{len(report.problems)} problem(s) in {report.file}; every submit fails",
            tuple(p.as_dict() for p in report.problems),
        )
    notes = tuple({"note": note} for note in report.notes)
    return Check(
        "contracts",
        "warn" if notes else "ok",
        f"{len(report.contracts)} contract(s) valid in {report.file}",
        notes,
    )


def check_conformance() -> Check:
    """Every active idempotent / reconcilable contract version has a passing
    ``contracts conform`` run (issue 22): the class is a promise the broker acts on."""
    from effect_broker.domain.contracts import load_contracts
    from effect_broker.services.conformance_runs import proofs

    found = proofs(load_contracts(settings.EFFECT_BROKER_CONTRACTS))
    details = tuple({"message": proof.line()} for proof in found)
    missing = [proof for proof in found if not proof.proved]
    if missing:
        return Check(
            "conformance",
            "warn",
            f"{len(missing)} of {len(found)} idempotent/reconcilable contract "
            "version(s) have no passing conformance run: "
            + ", ".join(f"{m.contract}@{m.version}" for m in missing),
            details,
        )
    return Check(
        "conformance",
        "ok",
        f"{len(found)} idempotent/reconcilable contract version(s), each proved",
        details,
    )


# --- workers and jobs -----------------------------------------------------------


def worker_rows() -> list[dict[str, Any]]:
    """Registered procrastinate workers with their heartbeat age (database clock)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT w.id, EXTRACT(EPOCH FROM now() - w.last_heartbeat)::float8,"
            "       count(j.id) FILTER (WHERE j.status = 'doing')"
            "  FROM procrastinate_workers w"
            "  LEFT JOIN procrastinate_jobs j ON j.worker_id = w.id"
            " GROUP BY w.id ORDER BY w.id"
        )
        return [
            {"worker_id": wid, "heartbeat_age_seconds": round(age, 1), "running": running}
            for wid, age, running in cur.fetchall()
        ]


def check_workers(timeout: float | None = None) -> Check:
    """At least one worker heartbeats; a registered worker that stopped is dead.

    A worker that stops cleanly unregisters itself, so a row whose heartbeat is
    older than the timeout is a worker that died (SIGKILL, OOM, a lost host).
    """
    limit = worker_timeout() if timeout is None else timeout
    rows = worker_rows()
    for row in rows:
        row["state"] = "alive" if row["heartbeat_age_seconds"] <= limit else "dead"
    live = [r for r in rows if r["state"] == "alive"]
    dead = [r for r in rows if r["state"] == "dead"]
    dead_text = (
        f"; {len(dead)} dead (no heartbeat for over {limit:g}s: "
        + ", ".join(
            f"worker {r['worker_id']} last seen {_age(r['heartbeat_age_seconds'])} ago"
            for r in dead
        )
        + ")"
        if dead
        else ""
    )
    if not live:
        return Check(
            "workers",
            "fail",
            f"no live worker: nothing dispatches or reconciles{dead_text}",
            tuple(rows),
        )
    return Check(
        "workers",
        "warn" if dead else "ok",
        f"{len(live)} alive{dead_text}",
        tuple(rows),
    )


def check_stalled_jobs(timeout: float | None = None) -> Check:
    """Jobs marked running whose worker is dead or gone: their effects are stuck until
    a live worker's sweeper retries them (``tasks.retry_stalled_jobs``)."""
    limit = worker_timeout() if timeout is None else timeout
    with connection.cursor() as cur:
        cur.execute(
            "SELECT j.id, j.task_name, j.queue_name, j.args->>'effect_id', j.worker_id"
            "  FROM procrastinate_jobs j"
            "  LEFT JOIN procrastinate_workers w ON w.id = j.worker_id"
            " WHERE j.status = 'doing'"
            "   AND (w.id IS NULL"
            "        OR w.last_heartbeat < now() - make_interval(secs => %s))"
            " ORDER BY j.id",
            [limit],
        )
        rows = [
            {
                "job_id": job_id,
                "task": task,
                "queue": queue,
                "effect_id": effect_id,
                "worker_id": worker_id,
            }
            for job_id, task, queue, effect_id, worker_id in cur.fetchall()
        ]
    if rows:
        return Check(
            "stalled_jobs",
            "warn",
            f"{len(rows)} job(s) held by a dead worker; a live worker's sweeper "
            "retries them",
            tuple(rows),
        )
    return Check("stalled_jobs", "ok", "none")


# --- effects --------------------------------------------------------------------


def check_waiting_effects(max_age: timedelta) -> Check:
    """The oldest ``outcome_unknown`` and ``manual_review`` effect per tool, with age.

    Age counts from the effect's last change, which for these states is when it
    entered them (nothing but an operator or a reconciliation moves it).
    """
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tool, status, count(*),"
            "       EXTRACT(EPOCH FROM now() - min(updated_at))::float8,"
            "       (array_agg(id ORDER BY updated_at))[1]"
            "  FROM effect_intents WHERE status = ANY(%s)"
            " GROUP BY tool, status ORDER BY 4 DESC",
            [list(WAITING)],
        )
        rows = [
            {
                "tool": tool,
                "status": status,
                "count": count,
                "oldest_effect_id": str(oldest),
                "oldest_age_seconds": round(age, 1),
                "oldest_age": _age(age),
            }
            for tool, status, count, age, oldest in cur.fetchall()
        ]
    if not rows:
        return Check("waiting_effects", "ok", "no effect waits for an operator")
    total = sum(r["count"] for r in rows)
    oldest = rows[0]
    summary = (
        f"{total} effect(s) wait for an operator; oldest {oldest['status']} "
        f"{oldest['oldest_effect_id']} ({oldest['tool']}) for {oldest['oldest_age']}"
    )
    too_old = oldest["oldest_age_seconds"] > max_age.total_seconds()
    if too_old:
        summary += f", over the {_age(max_age.total_seconds())} limit"
    return Check("waiting_effects", "fail" if too_old else "warn", summary, tuple(rows))


def check_pauses() -> Check:
    """Operator pauses of dispatch (issue 24): each one active, who paused it, when,
    why, and how many effects wait on it. A pause is deliberate, so a warning, never
    a failure: doctor says what is held, the operator decides."""
    from effect_broker.services import pauses

    active = pauses.active_pauses()
    if not active:
        return Check("pauses", "ok", "no dispatch pause")
    now = timezone.now()
    rows: tuple[dict[str, Any], ...] = tuple(
        {
            "pause_id": p.pause_id,
            "scope": p.describe(),
            "paused_by": p.paused_by,
            "paused_at": p.paused_at.isoformat(),
            "age": _age((now - p.paused_at).total_seconds()),
            "reason": p.reason,
            "held_effects": pauses.held_count(p.pause_id),
        }
        for p in active
    )
    held = pauses.held_total()  # an effect two pauses hold is counted once
    return Check(
        "pauses",
        "warn",
        f"{len(rows)} active pause(s) hold {held} effect(s): "
        + "; ".join(f"{row['scope']} ({row['age']})" for row in rows)
        + "; resume with: effect-broker tools resume",
        rows,
    )


def run_checks(options: DoctorOptions | None = None) -> list[Check]:
    """Every doctor check, in the order an operator would fix them."""
    from effect_broker.services.key_lint import (
        check_key_retention,
        check_operation_keys,
    )

    opts = options or DoctorOptions()
    checks = [check_database()]
    database_ok = checks[0].status == "ok"
    if database_ok:
        checks.append(check_migrations())
        checks.append(check_procrastinate_schema())
    else:
        checks += [_skipped("migrations"), _skipped("procrastinate_schema")]
    schema_ok = all(c.status == "ok" for c in checks)
    contracts = check_contracts()
    later: list[tuple[str, Callable[[], Check]]] = [
        ("master_key", check_master_key),
        ("workers", check_workers),
        ("stalled_jobs", check_stalled_jobs),
        ("waiting_effects", lambda: check_waiting_effects(opts.max_waiting_age)),
        ("pauses", check_pauses),
    ]
    for name, run in later[:1]:
        checks.append(run() if schema_ok else _skipped(name))
    checks.append(contracts)
    for name, run in later[1:]:
        checks.append(run() if schema_ok else _skipped(name))
    checks.append(
        check_conformance()
        if schema_ok and contracts.status != "fail"
        else _skipped("conformance")
    )
    checks.append(check_key_retention())
    checks.append(
        check_operation_keys(opts.lint_sample)
        if schema_ok
        else _skipped("operation_keys")
    )
    return checks


def _skipped(name: str) -> Check:
    return Check(name, "skipped", "needs a reachable, migrated database")
