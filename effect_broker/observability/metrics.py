"""The broker's domain metrics: what happened to effects, counted where it happened.

Spec "Required observability". Every series is labelled by the contract an effect is
pinned to - ``tool``, ``contract``, ``contract_version``, ``safety_class`` - and by
nothing that grows with traffic: never a tenant, an operation key or an effect id
(those would make one series per caller or per effect, and leak who does what).
Labels come from the contract registry or the ledger row, so their values are bounded
by the contracts file.

Each function here is one or two ``prometheus_client`` calls, with no I/O: they are
called on the submit and dispatch paths, after the ledger write they describe has
returned (a write the fence refused is not counted as its outcome).

The gauges read from the ledger at scrape time (unknown count and oldest age) are in
``collectors``; they describe the ledger, not a process, so only the API serves them.
"""

from __future__ import annotations

from datetime import datetime

from prometheus_client import Counter, Histogram, disable_created_metrics

from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.records import EffectRecord

# Each counter and histogram would also export a ``_created`` series (its creation
# time), which Prometheus stores as one more series per label set: twice the series
# for nothing the rules or the dashboard read. Process-wide, like the registry.
disable_created_metrics()

#: The labels every effect series carries (the pinned contract, never the caller).
EFFECT_LABELS = ("tool", "contract", "contract_version", "safety_class")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_DISPATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_END_TO_END_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    *(300, 900, 3600, 6 * 3600, 86400),
)
#: ``le="0"`` holds every retry sent with its key already forgotten (a negative
#: remaining): the alert "retry attempted after key expiry" reads that bucket.
_RETENTION_BUCKETS = (0, 60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400)

SUBMITTED = Counter(
    "effect_broker_effects_submitted",
    "Effects reserved by a submit (the first submit of its operation key).",
    EFFECT_LABELS,
)
DEDUPLICATED = Counter(
    "effect_broker_effects_deduplicated",
    "Submits that replayed an existing effect (same key, same payload): nothing new.",
    EFFECT_LABELS,
)
CONFLICTED = Counter(
    "effect_broker_effects_conflicted",
    "Submits refused because the key names an effect they do not match (reason: "
    "payload_drift = other arguments; pinned_contract_missing = the pinned contract "
    "is no longer deployed). Nothing was written or dispatched.",
    (*EFFECT_LABELS, "reason"),
)
SUCCEEDED = Counter(
    "effect_broker_effects_succeeded",
    "Effects that reached succeeded with a receipt (via: dispatch or reconcile).",
    (*EFFECT_LABELS, "via"),
)
FAILED = Counter(
    "effect_broker_effects_failed",
    "Effects that reached failed_final (a proved refusal or spent retries).",
    EFFECT_LABELS,
)
UNKNOWN = Counter(
    "effect_broker_effects_unknown",
    "Times an effect's outcome became unknown (cause: the event that recorded it).",
    (*EFFECT_LABELS, "cause"),
)
MANUAL_REVIEW = Counter(
    "effect_broker_effects_manual_review",
    "Effects handed to an operator (manual_review): automatic handling stopped.",
    EFFECT_LABELS,
)
DISPATCH_ATTEMPTS = Counter(
    "effect_broker_dispatch_attempts",
    "Dispatch attempts by how the call ended: succeeded, not_committed (proved, "
    "retryable), refused (terminal), unknown (bytes may have left, no answer).",
    (*EFFECT_LABELS, "outcome"),
)
DISPATCH_SECONDS = Histogram(
    "effect_broker_dispatch_duration_seconds",
    "Time of one dispatch attempt's call to the target, by outcome.",
    (*EFFECT_LABELS, "outcome"),
    buckets=_DISPATCH_BUCKETS,
)
RECONCILIATIONS = Counter(
    "effect_broker_reconciliations",
    "Reconciliations of unknown outcomes, by the status they left the effect in.",
    (*EFFECT_LABELS, "outcome"),
)
RECONCILE_SECONDS = Histogram(
    "effect_broker_reconcile_duration_seconds",
    "Time of one reconciliation (probe or same-key resend, and its write).",
    (*EFFECT_LABELS, "outcome"),
    buckets=_DISPATCH_BUCKETS,
)
LEASE_EXPIRATIONS = Counter(
    "effect_broker_lease_expirations",
    "Leases the sweeper found expired (stage: dispatching or reconciling); a "
    "dispatching one becomes outcome_unknown.",
    (*EFFECT_LABELS, "stage"),
)
STALE_WRITES = Counter(
    "effect_broker_stale_writes",
    "Worker writes refused by the version fence (a zombie or late worker); each is "
    "also a row in effect_stale_writes.",
)
RETRY_RETENTION = Histogram(
    "effect_broker_retry_key_retention_remaining_seconds",
    "Seconds the target still keeps the downstream key when an idempotent effect is "
    "retried (a retry or a same-key resend); <= 0 means the key was already gone.",
    EFFECT_LABELS,
    buckets=_RETENTION_BUCKETS,
)
RETRY_BLOCKED = Counter(
    "effect_broker_retries_blocked_by_key_expiry",
    "Retries that came due after the target may have forgotten the key: not sent, "
    "the effect went to manual_review.",
    EFFECT_LABELS,
)
DEFERRED = Counter(
    "effect_broker_dispatch_deferred",
    "Times a due send waited instead of starting (reason: paused = an operator's "
    "pause holds it; max_in_flight or rate_limit = the contract's limit, and it "
    "runs again shortly). Nothing is failed for it (issue 24).",
    (*EFFECT_LABELS, "reason"),
)
APPROVALS = Counter(
    "effect_broker_approvals",
    "Decisions on effects that waited for an operator's approval (issue 24): "
    "approved, denied (by an operator) or expired (no decision before the "
    "contract's approval_ttl). A denied or expired effect was never sent.",
    (*EFFECT_LABELS, "decision"),
)
SUBMIT_SECONDS = Histogram(
    "effect_broker_submit_duration_seconds",
    "Time of a submit in the broker (validation, hashing, encryption, reservation).",
    EFFECT_LABELS,
    buckets=_LATENCY_BUCKETS,
)
SUBMIT_TO_RECEIPT_SECONDS = Histogram(
    "effect_broker_submit_to_receipt_seconds",
    "From reservation to the receipt's commit, for effects that succeeded.",
    EFFECT_LABELS,
    buckets=_END_TO_END_BUCKETS,
)

#: Every metric family this module exports (tests check alerts and dashboards
#: reference only names that exist).
ALL = (
    SUBMITTED,
    DEDUPLICATED,
    CONFLICTED,
    SUCCEEDED,
    FAILED,
    UNKNOWN,
    MANUAL_REVIEW,
    DISPATCH_ATTEMPTS,
    DISPATCH_SECONDS,
    RECONCILIATIONS,
    RECONCILE_SECONDS,
    LEASE_EXPIRATIONS,
    STALE_WRITES,
    RETRY_RETENTION,
    RETRY_BLOCKED,
    DEFERRED,
    APPROVALS,
    SUBMIT_SECONDS,
    SUBMIT_TO_RECEIPT_SECONDS,
)


def record_labels(record: EffectRecord) -> tuple[str, str, str, str]:
    """The label values of an effect: the contract it is pinned to."""
    return (
        record.tool,
        record.contract_name,
        record.contract_version,
        record.safety.value,
    )


def contract_labels(contract: EffectContract) -> tuple[str, str, str, str]:
    """The label values of a contract (for a submit refused before any row is read)."""
    return (contract.tool, contract.name, contract.version, contract.safety.value)


def submitted(record: EffectRecord, *, created: bool, seconds: float) -> None:
    """A submit reserved a new effect (``created``) or replayed an existing one."""
    labels = record_labels(record)
    (SUBMITTED if created else DEDUPLICATED).labels(*labels).inc()
    SUBMIT_SECONDS.labels(*labels).observe(seconds)


def conflicted(contract: EffectContract, *, reason: str) -> None:
    """A submit was refused: its key names an effect it does not match."""
    CONFLICTED.labels(*contract_labels(contract), reason).inc()


def succeeded(record: EffectRecord, *, via: str, now: datetime) -> None:
    """A receipt committed; ``now`` is the clock reading written with it."""
    labels = record_labels(record)
    SUCCEEDED.labels(*labels, via).inc()
    seconds = (now - record.created_at).total_seconds()
    SUBMIT_TO_RECEIPT_SECONDS.labels(*labels).observe(max(seconds, 0.0))


def failed(record: EffectRecord) -> EffectRecord:
    """An effect reached failed_final; returns it (``return metrics.failed(...)``)."""
    FAILED.labels(*record_labels(record)).inc()
    return record


def unknown(record: EffectRecord, *, cause: str) -> None:
    """An effect's outcome became unknown (``cause``: the event type written)."""
    UNKNOWN.labels(*record_labels(record), cause).inc()


def manual_review(record: EffectRecord) -> EffectRecord:
    """An effect was handed to an operator; returns it."""
    MANUAL_REVIEW.labels(*record_labels(record)).inc()
    return record


def attempt_ended(record: EffectRecord, *, outcome: str, seconds: float) -> None:
    """One call to the target ended with ``outcome`` after ``seconds``."""
    labels = record_labels(record)
    DISPATCH_ATTEMPTS.labels(*labels, outcome).inc()
    DISPATCH_SECONDS.labels(*labels, outcome).observe(seconds)


def reconciled(record: EffectRecord, *, seconds: float) -> None:
    """A reconciliation ended; its outcome is the status it left ``record`` in."""
    labels = record_labels(record)
    RECONCILIATIONS.labels(*labels, record.status.value).inc()
    RECONCILE_SECONDS.labels(*labels, record.status.value).observe(seconds)


def lease_expired(record: EffectRecord) -> None:
    """The sweeper converted an expired lease (``record`` as it was found)."""
    LEASE_EXPIRATIONS.labels(*record_labels(record), record.status.value).inc()


def stale_write() -> None:
    """A write was refused by the fence and recorded."""
    STALE_WRITES.inc()


def retry_retention(record: EffectRecord, database_now: datetime) -> None:
    """An idempotent effect is being retried: how long its key is still kept."""
    if record.retention_deadline is not None:
        remaining = (record.retention_deadline - database_now).total_seconds()
        RETRY_RETENTION.labels(*record_labels(record)).observe(remaining)


def retry_blocked(record: EffectRecord) -> None:
    """A retry came due after the key's retention: refused, sent to an operator."""
    RETRY_BLOCKED.labels(*record_labels(record)).inc()


def deferred(record: EffectRecord, *, reason: str) -> None:
    """A due send waited: an operator's pause, or the contract's limit."""
    DEFERRED.labels(*record_labels(record), reason).inc()


def approval_decided(record: EffectRecord, decision: str) -> None:
    """An effect awaiting approval was approved, denied or expired."""
    APPROVALS.labels(*record_labels(record), decision).inc()
