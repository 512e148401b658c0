"""Deterministic in-process targets: one per safety class, plus a local transactional one.

``SimulatedTarget`` is a payment target with an authoritative table, for property tests,
benchmarks and the conformance suite. It keeps the truth the broker cannot see (its
``rows`` and the ``requests`` that reached it), so a test can assert how many effects
really happened. Faults are injected per target and model the failures of the spec's
"sharp problem": a lost response after commit, an explicit rejection, a refused
connection, a timeout before commit, a definitive refusal, a key in use by another
request, and an unavailable lookup.

``SimulatedAdapter`` talks to it through the ``EffectAdapter`` protocol and classifies
each target-world failure the way a real adapter must (errors.py): only proof of
non-commit is retryable. ``SimulatedLocalAdapter`` is the ``transactional`` class: its
mutation is an INSERT on the broker's own database connection, inside the transaction
that also writes the receipt.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from django.db import IntegrityError, connection, transaction

from effect_broker.adapters.base import (
    DispatchRequest,
    DispatchResult,
    EffectAdapter,
    ProbeRequest,
    ProbeResult,
)
from effect_broker.domain.clock import Clock, SystemClock
from effect_broker.domain.contracts import EffectContract, parse_duration
from effect_broker.domain.errors import (
    ConfigurationError,
    OutcomeUnknownError,
    RetryableAdapterError,
    TerminalAdapterError,
)
from effect_broker.domain.states import ProbeStatus, SafetyClass


class Fault(StrEnum):
    """A failure to inject into the next matching request at a simulated target."""

    #: The target commits, then the response is lost: the adapter cannot tell.
    LOSE_RESPONSE = "lose_response"
    #: An explicit rejection before commit (a documented "not committed" answer).
    REJECT = "reject"
    #: Nothing reaches the target (connection refused); ``requests`` is unchanged.
    REFUSE_CONNECTION = "refuse_connection"
    #: The request reached the target, nothing committed, and no answer came back.
    TIMEOUT_BEFORE_COMMIT = "timeout_before_commit"
    #: A definitive refusal (4xx-like); retrying cannot succeed.
    TERMINAL = "terminal"
    #: "A request with this key is in progress" (HTTP 409/423): this request was not
    #: applied; retry later with the same key.
    KEY_IN_USE = "key_in_use"
    #: The next lookup fails: the probe must come back UNKNOWN.
    PROBE_UNAVAILABLE = "probe_unavailable"
    #: The target commits, then answers with an error it documents as nothing (an
    #: MCP tool that raised after acting, an HTTP 500): the adapter cannot tell.
    FAIL_AFTER_COMMIT = "fail_after_commit"


class TargetFailure(Exception):
    """What the simulated target or its wire did instead of answering normally."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class SimulatedRow:
    """One committed effect in the target's authoritative table."""

    external_id: str
    key: str | None
    payload_hash: bytes
    committed_at: datetime


_TARGET_MODES = (SafetyClass.IDEMPOTENT, SafetyClass.RECONCILABLE, SafetyClass.UNSAFE)


class SimulatedTarget:
    """A thread-safe in-memory payment target with an authoritative table."""

    def __init__(
        self,
        mode: SafetyClass | str,
        *,
        clock: Clock | None = None,
        key_retention: timedelta | None = None,
        settlement_delay: timedelta = timedelta(0),
    ) -> None:
        try:
            self.mode = SafetyClass(mode)
        except ValueError as exc:
            raise ConfigurationError(f"unknown simulated target mode {mode!r}") from exc
        if self.mode not in _TARGET_MODES:
            # A transactional effect must share the broker's transaction; an in-memory
            # table cannot, so pretending would make the guarantee a lie.
            raise ConfigurationError(
                f"simulated target mode {self.mode.value!r} is not supported; "
                "transactional contracts use adapter 'simulated-local'"
            )
        if settlement_delay < timedelta(0):
            raise ConfigurationError("settlement_delay must not be negative")
        self.clock: Clock = clock or SystemClock()
        self.key_retention = key_retention
        self.settlement_delay = settlement_delay
        self.rows: list[SimulatedRow] = []
        # Rows per key, oldest first: a create looks its key up without scanning every
        # row (the bench drives tens of thousands of effects through one target).
        self._by_key: dict[str, list[SimulatedRow]] = {}
        self.requests = 0
        self.lookups = 0
        self._faults: deque[Fault] = deque()
        self._serial = 0
        self._lock = threading.Lock()

    def inject(self, fault: Fault, times: int = 1) -> None:
        """Queue ``fault`` for the next ``times`` matching requests (FIFO per target)."""
        if times < 1:
            raise ValueError("times must be >= 1")
        with self._lock:
            self._faults.extend([Fault(fault)] * times)

    def clear_faults(self) -> None:
        """Drop queued faults that no request consumed (rows and counters stay)."""
        with self._lock:
            self._faults.clear()

    def reset(self) -> None:
        """Forget every row, counter and queued fault."""
        with self._lock:
            self.rows.clear()
            self._by_key.clear()
            self.requests = self.lookups = self._serial = 0
            self._faults.clear()

    def _take_fault(self, *, probe: bool) -> Fault | None:
        # Dispatch and lookup faults share one queue but never consume each other's:
        # a queued PROBE_UNAVAILABLE must not turn into a lost dispatch response.
        for fault in self._faults:
            if (fault is Fault.PROBE_UNAVAILABLE) == probe:
                self._faults.remove(fault)
                return fault
        return None

    def _live_row(self, key: str) -> SimulatedRow | None:
        """The newest row still holding ``key`` within the retention horizon."""
        now = self.clock.now()
        for row in reversed(self._by_key.get(key, ())):
            if self.key_retention is None or row.committed_at + self.key_retention > now:
                return row
            # Past the horizon the key is forgotten; a resend creates a second effect
            # (guarantee vocabulary: the honest failure mode of an expired horizon).
            return None
        return None

    def create(self, key: str | None, payload_hash: bytes) -> SimulatedRow:
        """Handle one create request; raise ``TargetFailure`` for a non-answer."""
        with self._lock:
            fault = self._take_fault(probe=False)
            if fault is Fault.REFUSE_CONNECTION:
                raise TargetFailure("connection_refused")
            self.requests += 1
            if fault is Fault.REJECT:
                raise TargetFailure("rejected")
            if fault is Fault.TERMINAL:
                raise TargetFailure("refused")
            if fault is Fault.KEY_IN_USE:
                raise TargetFailure("key_in_use")
            if fault is Fault.TIMEOUT_BEFORE_COMMIT:
                raise TargetFailure("no_response")
            row: SimulatedRow | None = None
            if self.mode is SafetyClass.IDEMPOTENT and key is not None:
                row = self._live_row(key)
                if row is not None and row.payload_hash != payload_hash:
                    raise TargetFailure("key_reused")
            if row is None:
                self._serial += 1
                row = SimulatedRow(
                    external_id=f"ch_sim_{self._serial:06d}",
                    key=key if self.mode is not SafetyClass.UNSAFE else None,
                    payload_hash=payload_hash,
                    committed_at=self.clock.now(),
                )
                self.rows.append(row)
                if row.key is not None:
                    self._by_key.setdefault(row.key, []).append(row)
            if fault is Fault.LOSE_RESPONSE:
                raise TargetFailure("no_response")
            if fault is Fault.FAIL_AFTER_COMMIT:
                raise TargetFailure("error_after_commit")
            return row

    def lookup(self, key: str) -> list[SimulatedRow]:
        """Rows recorded under ``key`` that are visible now (settled)."""
        with self._lock:
            self.lookups += 1
            if self.mode is SafetyClass.UNSAFE:
                raise TargetFailure("no_lookup")
            if self._take_fault(probe=True) is not None:
                raise TargetFailure("lookup_unavailable")
            now = self.clock.now()
            # Eventual consistency with a declared bound: a row is invisible until
            # settlement_delay after its commit (spec, reconcilable safety class).
            return [
                row
                for row in self._by_key.get(key, ())
                if row.committed_at + self.settlement_delay <= now
            ]

    def effect_count(self, key: str | None = None) -> int:
        """How many effects really happened (under ``key`` when given)."""
        with self._lock:
            if key is None:
                return len(self.rows)
            return len(self._by_key.get(key, ()))


simulated_targets: dict[str, SimulatedTarget] = {}
"""Process-wide simulated targets, one per contract name."""

_registry_lock = threading.Lock()


def _settlement_delay(contract: EffectContract) -> timedelta:
    raw = contract.adapter_options.get("settlement_delay")
    if raw is None:
        return contract.settlement_bound or timedelta(0)
    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise ConfigurationError(
            f"adapter_options.settlement_delay: {exc}", contract=contract.name
        ) from exc


def get_target(
    contract: EffectContract, *, clock: Clock | None = None
) -> SimulatedTarget:
    """Return the process-wide target for ``contract.name``, creating it on first use."""
    with _registry_lock:
        target = simulated_targets.get(contract.name)
        if target is None:
            target = SimulatedTarget(
                str(contract.adapter_options.get("mode", contract.safety)),
                clock=clock,
                key_retention=contract.key_retention,
                settlement_delay=_settlement_delay(contract),
            )
            simulated_targets[contract.name] = target
        return target


def reset_targets() -> None:
    """Drop every process-wide simulated target (tests)."""
    with _registry_lock:
        simulated_targets.clear()


def _probe_evidence(checked_at: datetime, visible: int) -> dict[str, object]:
    return {"checked_at": checked_at.isoformat(), "visible_rows": visible}


class SimulatedAdapter(EffectAdapter):
    """Adapter for a ``SimulatedTarget``; classifies its failures like a real wire."""

    name = "simulated"

    def __init__(self, contract: EffectContract, target: SimulatedTarget | None = None):
        super().__init__(contract)
        self.target = target if target is not None else get_target(contract)

    def _send(self, request: DispatchRequest) -> DispatchResult:
        """Send the create once; map each target failure to what it proves."""
        # An unsafe target takes no key; sending one would not make it safe.
        key = None if self.target.mode is SafetyClass.UNSAFE else request.downstream_key
        try:
            row = self.target.create(key, request.effect.request_hash)
        except TargetFailure as exc:
            raise self._classify(exc) from exc
        return DispatchResult(
            external_id=row.external_id,
            output={"charge_id": row.external_id, "status": "succeeded"},
            target_timestamp=row.committed_at,
        )

    def _classify(
        self, failure: TargetFailure
    ) -> RetryableAdapterError | TerminalAdapterError | OutcomeUnknownError:
        if failure.kind in {"connection_refused", "rejected", "key_in_use"}:
            return RetryableAdapterError(
                "the simulated target proved nothing committed",
                adapter=self.name,
                reason=failure.kind,
            )
        if failure.kind in {"refused", "key_reused"}:
            return TerminalAdapterError(
                "the simulated target refused the request definitively",
                adapter=self.name,
                reason=failure.kind,
            )
        # no_response: bytes reached the target and nothing came back (spec rule 3);
        # error_after_commit: an undocumented error proves nothing either way.
        return OutcomeUnknownError(
            "no answer from the simulated target", adapter=self.name, reason=failure.kind
        )

    def _lookup(self, request: ProbeRequest) -> ProbeResult:
        """Authoritative lookup by key; UNKNOWN for an unsafe target."""
        if self.target.mode is SafetyClass.UNSAFE:
            return ProbeResult(
                status=ProbeStatus.UNKNOWN, evidence={"reason": "no lookup"}
            )
        checked_at = self.target.clock.now()
        rows = self.target.lookup(request.downstream_key)  # failures -> UNKNOWN (base)
        evidence = _probe_evidence(checked_at, len(rows))
        if not rows:
            # Not conclusive by itself: the broker compares checked_at with the
            # effect's settlement deadline (spec rule 5), the adapter does not.
            return ProbeResult(status=ProbeStatus.NOT_COMMITTED, evidence=evidence)
        first = rows[0]
        return ProbeResult(
            status=ProbeStatus.COMMITTED,
            external_id=first.external_id,
            output={"charge_id": first.external_id, "status": "succeeded"},
            evidence=evidence,
        )


_LOCAL_TABLE = "simulated_local_effects"
_CREATE_LOCAL_TABLE = f"""
CREATE TABLE IF NOT EXISTS {_LOCAL_TABLE} (
    id uuid PRIMARY KEY,
    downstream_key text NOT NULL UNIQUE,
    payload_hash bytea NOT NULL,
    created_at timestamptz NOT NULL
)"""


def _local_table_exists() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [_LOCAL_TABLE])
        row = cursor.fetchone()
    return bool(row and row[0])


def _ensure_local_table() -> None:
    # Checked on every call, not cached: a table created inside a transaction that
    # later rolls back is gone again, and a cached flag would then lie.
    if _local_table_exists():
        return
    with connection.cursor() as cursor:
        # Two first uses racing on CREATE TABLE IF NOT EXISTS can still collide in
        # the catalog (unique violation on pg_type) and abort the caller's
        # transaction; a transaction-scoped advisory lock serialises them.
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [_LOCAL_TABLE])
        cursor.execute(_CREATE_LOCAL_TABLE)


def local_effect_count(downstream_key: str | None = None) -> int:
    """How many local effects committed (under ``downstream_key`` when given)."""
    if not _local_table_exists():
        return 0
    with connection.cursor() as cursor:
        if downstream_key is None:
            cursor.execute(f"SELECT count(*) FROM {_LOCAL_TABLE}")
        else:
            cursor.execute(
                f"SELECT count(*) FROM {_LOCAL_TABLE} WHERE downstream_key = %s",
                [downstream_key],
            )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


class SimulatedLocalAdapter(EffectAdapter):
    """The transactional class: an INSERT in the broker's database, same transaction."""

    name = "simulated-local"
    transactional = True

    def _send(self, request: DispatchRequest) -> DispatchResult:
        """Insert the local effect on Django's connection, inside the caller's atomic."""
        if not connection.in_atomic_block:
            # Outside the receipt's transaction the insert would autocommit on its
            # own and a crash before the receipt would leave an effect without one:
            # exactly what the transactional class promises cannot happen.
            raise TerminalAdapterError(
                "a transactional adapter must run inside transaction.atomic()",
                adapter=self.name,
                reason="not_in_transaction",
            )
        _ensure_local_table()
        try:
            # A savepoint, so a refused duplicate leaves the caller's transaction
            # usable for the failure bookkeeping it still has to write.
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {_LOCAL_TABLE} (id, downstream_key, payload_hash, "
                    "created_at) VALUES (%s, %s, %s, now()) RETURNING id, created_at",
                    [uuid.uuid4(), request.downstream_key, request.effect.request_hash],
                )
                row = cursor.fetchone()
        except IntegrityError as exc:
            # The key already committed in an earlier transaction, so the effect did
            # happen: never report that as a failure. The probe finds the row.
            raise OutcomeUnknownError(
                "a local effect with this downstream key already committed",
                adapter=self.name,
                reason="duplicate_local_effect",
            ) from exc
        assert row is not None
        effect_id, created_at = str(row[0]), row[1]
        return DispatchResult(
            external_id=effect_id,
            output={"local_effect_id": effect_id, "status": "committed"},
            target_timestamp=created_at,
        )

    def _lookup(self, request: ProbeRequest) -> ProbeResult:
        """Same database, read-committed: absence is conclusive immediately."""
        if not _local_table_exists():
            return ProbeResult(status=ProbeStatus.NOT_COMMITTED, evidence={"rows": 0})
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT now(), (SELECT id FROM {_LOCAL_TABLE} "
                "WHERE downstream_key = %s)",
                [request.downstream_key],
            )
            row = cursor.fetchone()
        assert row is not None
        checked_at, found = row
        if found is None:
            return ProbeResult(
                status=ProbeStatus.NOT_COMMITTED, evidence=_probe_evidence(checked_at, 0)
            )
        return ProbeResult(
            status=ProbeStatus.COMMITTED,
            external_id=str(found),
            output={"local_effect_id": str(found), "status": "committed"},
            evidence=_probe_evidence(checked_at, 1),
        )


__all__ = [
    "Fault",
    "SimulatedAdapter",
    "SimulatedLocalAdapter",
    "SimulatedRow",
    "SimulatedTarget",
    "TargetFailure",
    "get_target",
    "local_effect_count",
    "reset_targets",
    "simulated_targets",
]
