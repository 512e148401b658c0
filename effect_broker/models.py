"""Ledger tables. Django models are for reading; ``effect_broker.store`` writes.

Every ledger model refuses the ORM's write methods (``save``, ``delete``, and on its
manager ``create``/``update``/``bulk_*``/``delete``): the only write path is the store's
fenced compare-and-swap SQL, which bumps ``version`` and appends the transition event in
the same transaction (STYLE rule 1). A migration backs this with triggers, so even raw
SQL cannot rewrite receipts or events, nor update an intent without bumping its version
by exactly one.
"""

from __future__ import annotations

import uuid
from typing import Any, NoReturn

from django.conf import settings
from django.db import models

from effect_broker.domain.errors import UnfencedWriteError
from effect_broker.domain.states import EffectStatus, SafetyClass

STATUS_CHOICES = [(s.value, s.value) for s in EffectStatus]
SAFETY_CHOICES = [(s.value, s.value) for s in SafetyClass]


def _refuse(what: str) -> NoReturn:
    raise UnfencedWriteError(
        f"{what} would bypass the fence; ledger rows are written only by "
        "effect_broker.store (compare-and-swap on version)"
    )


class FencedQuerySet(models.QuerySet):
    """A read-only queryset: every bulk write path raises ``UnfencedWriteError``."""

    def update(self, **kwargs: Any) -> NoReturn:
        _refuse("QuerySet.update()")

    def bulk_update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("QuerySet.bulk_update()")

    def delete(self) -> NoReturn:
        _refuse("QuerySet.delete()")

    def create(self, **kwargs: Any) -> NoReturn:
        _refuse("QuerySet.create()")

    def bulk_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("QuerySet.bulk_create()")

    def get_or_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("QuerySet.get_or_create()")

    def update_or_create(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("QuerySet.update_or_create()")


FencedManager = models.Manager.from_queryset(FencedQuerySet)


class LedgerModel(models.Model):
    """Base for ledger rows: readable through the ORM, never written through it."""

    objects = FencedManager()

    class Meta:
        abstract = True
        # Django's internal paths (``refresh_from_db``, related descriptors, and any
        # ``Model._base_manager.update()``) use the base manager, not ``objects``; a
        # plain Manager there would be an unfenced ``update()`` (issue 9, defect 9).
        base_manager_name = "objects"

    def save(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(f"{type(self).__name__}.save()")

    def save_base(self, *args: Any, **kwargs: Any) -> NoReturn:
        # save() is not the only entry: save_base() writes the row without it.
        _refuse(f"{type(self).__name__}.save_base()")

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(f"{type(self).__name__}.delete()")


class Tenant(models.Model):
    """A caller organisation. Identity comes from its API key, never from a request."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, unique=True)
    # SHA-256 hex of the API key: the key itself is shown once and never stored.
    api_key_hash = models.CharField(max_length=64, unique=True)
    # Names the HKDF input for this tenant's downstream-key HMAC key (rotation later).
    hmac_key_id = models.CharField(max_length=64, default="h1")
    disabled = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "tenants"

    def __str__(self) -> str:
        return self.name


class EffectIntent(LedgerModel):
    """The business intent: one row per (tenant, operation_key), fenced by version."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: (tenant, operation_key) and the list index lead with tenant.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="effects", db_index=False
    )
    operation_key = models.TextField()
    tool = models.TextField()
    request_hash = models.BinaryField()
    # AES-GCM(nonce || ciphertext) of the canonical arguments; key id names the key.
    arguments_ciphertext = models.BinaryField()
    arguments_key_id = models.CharField(max_length=64)
    arguments_preview = models.JSONField(default=dict)
    contract_name = models.TextField()
    contract_version = models.TextField()
    safety_class = models.CharField(max_length=16, choices=SAFETY_CHOICES)
    downstream_key = models.TextField()
    status = models.CharField(max_length=20, choices=STATUS_CHOICES)
    version = models.BigIntegerField()
    attempt_count = models.IntegerField(default=0)
    next_action_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.TextField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    first_dispatch_at = models.DateTimeField(null=True, blank=True)
    retention_deadline = models.DateTimeField(null=True, blank=True)
    settlement_deadline = models.DateTimeField(null=True, blank=True)
    # Set when an attempt may have reached the target unanswered; cleared only by
    # proof of non-commit. While set, no refusal can end the effect failed_final.
    outcome_in_doubt = models.BooleanField(db_default=False)
    receipt_id = models.UUIDField(null=True, blank=True)
    trace_id = models.TextField(null=True, blank=True)
    # The submit span's W3C traceparent, so a worker's spans continue that trace
    # (effect_broker.observability.tracing); None when tracing saw no span.
    trace_context = models.TextField(null=True, blank=True)
    requested_by = models.TextField(default="", blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta(LedgerModel.Meta):
        db_table = "effect_intents"
        # Operator authority (issue 9, defect 5): resolving or forking an effect is
        # its own privilege, not "may edit intents"; the admin, the CLI (--as) and the
        # operator API (tokens owned by a staff user) all check this one permission.
        permissions = [
            ("resolve_effect", "Can resolve or fork effects as an operator"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "operation_key"],
                name="effect_intents_tenant_opkey_uniq",
            ),
            models.CheckConstraint(
                condition=models.Q(version__gte=1), name="effect_intents_version_positive"
            ),
        ]
        indexes = [
            # Due work: the sweeper looks up by status and due time. Only rows with a
            # next action are in it, so settled effects (most of a ledger) cost it
            # nothing, on write or on disk.
            models.Index(
                fields=["status", "next_action_at"],
                name="effect_intents_due_idx",
                condition=models.Q(next_action_at__isnull=False),
            ),
            models.Index(
                fields=["tenant", "status", "created_at"], name="effect_intents_list_idx"
            ),
            # The sweeper's "whose lease expired" scan touches only in-flight rows.
            models.Index(
                fields=["lease_expires_at"],
                name="effect_intents_lease_idx",
                condition=models.Q(status__in=["dispatching", "reconciling"]),
            ),
            # The /metrics scrape's "waiting for an answer or an operator" gauges
            # (effect_broker.observability.collectors) read only these rows.
            models.Index(
                fields=["status"],
                name="effect_intents_awaiting_idx",
                condition=models.Q(
                    status__in=["outcome_unknown", "manual_review", "awaiting_approval"]
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_key} [{self.status}]"


class EffectAttempt(LedgerModel):
    """One dispatch attempt, committed before any byte may leave the process."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: the unique (effect, ordinal) index leads with it.
    effect = models.ForeignKey(
        EffectIntent, on_delete=models.PROTECT, related_name="attempts", db_index=False
    )
    ordinal = models.IntegerField()
    worker = models.TextField()
    fencing_version = models.BigIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    request_digest = models.TextField(default="", blank=True)
    response_digest = models.TextField(default="", blank=True)
    transport_meta = models.JSONField(default=dict)
    error_category = models.TextField(default="", blank=True)
    outcome = models.TextField(default="", blank=True)
    bytes_may_have_left = models.BooleanField(default=False)

    class Meta(LedgerModel.Meta):
        db_table = "effect_attempts"
        constraints = [
            models.UniqueConstraint(
                fields=["effect", "ordinal"], name="effect_attempts_effect_ordinal_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.ordinal} of {self.effect_id}"


class EffectReceipt(LedgerModel):
    """The immutable terminal-success receipt; one per effect."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    effect = models.OneToOneField(
        EffectIntent, on_delete=models.PROTECT, related_name="receipt"
    )
    external_id = models.TextField(null=True, blank=True)
    result_ciphertext = models.BinaryField()
    result_key_id = models.CharField(max_length=64)
    result_preview = models.JSONField(default=dict)
    evidence_digest = models.TextField(default="", blank=True)
    target_timestamp = models.DateTimeField(null=True, blank=True)
    contract_version = models.TextField()
    downstream_key_digest = models.TextField()
    created_at = models.DateTimeField()

    class Meta(LedgerModel.Meta):
        db_table = "effect_receipts"

    def __str__(self) -> str:
        return f"receipt {self.id}"


class EffectEvent(LedgerModel):
    """An append-only transition event, chained to its predecessor by digest."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (effect, sequence) index leads with it.
    effect = models.ForeignKey(
        EffectIntent, on_delete=models.PROTECT, related_name="events", db_index=False
    )
    sequence = models.IntegerField()
    event_type = models.TextField()
    old_status = models.CharField(max_length=20, null=True, blank=True)
    new_status = models.CharField(max_length=20)
    version = models.BigIntegerField()
    actor = models.TextField()
    occurred_at = models.DateTimeField()
    metadata = models.JSONField(default=dict)
    prev_digest = models.BinaryField()
    digest = models.BinaryField()

    class Meta(LedgerModel.Meta):
        db_table = "effect_events"
        ordering = ["effect", "sequence"]
        constraints = [
            models.UniqueConstraint(
                fields=["effect", "sequence"], name="effect_events_effect_sequence_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.effect_id}#{self.sequence} {self.event_type}"


class StaleWrite(LedgerModel):
    """A write refused by the fence: who tried, on which version, and what it wanted.

    Recorded after the refused transaction rolled back, so a zombie worker's late write
    stays visible (spec: alert on any non-zero stale-worker write count).
    """

    id = models.BigAutoField(primary_key=True)
    effect = models.ForeignKey(
        EffectIntent, on_delete=models.PROTECT, related_name="stale_writes"
    )
    actor = models.TextField()
    expected_version = models.BigIntegerField()
    actual_version = models.BigIntegerField(null=True)
    attempted = models.TextField()
    occurred_at = models.DateTimeField()

    class Meta(LedgerModel.Meta):
        db_table = "effect_stale_writes"

    def __str__(self) -> str:
        return f"stale write on {self.effect_id} by {self.actor}"


class EffectFork(LedgerModel):
    """An operator's fork: the settled old effect and the new one that continues its
    business under a new operation key (spec "Replay and time-travel semantics").

    One row links both ways (``old.fork`` / ``new.forked_from``); it is written by
    ``effect_broker.store`` in the transaction that settles the old effect and reserves
    the new one, and a trigger refuses to update or delete it.
    """

    id = models.BigAutoField(primary_key=True)
    old_effect = models.OneToOneField(
        EffectIntent, on_delete=models.PROTECT, related_name="fork"
    )
    new_effect = models.OneToOneField(
        EffectIntent, on_delete=models.PROTECT, related_name="forked_from"
    )
    operator = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "effect_forks"

    def __str__(self) -> str:
        return f"fork {self.old_effect_id} -> {self.new_effect_id}"


class OperatorToken(models.Model):
    """A bearer token for the operator API, owned by one staff user.

    Only the SHA-256 of the token is stored; the token is shown once. The operator's
    identity is the owning user, and the user's permission is re-checked on every call,
    so taking ``resolve_effect`` away (or deactivating the user) disarms the token too.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="operator_tokens"
    )
    token_hash = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=64, default="operator")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "operator_tokens"

    def __str__(self) -> str:
        return f"{self.name} ({self.user_id})"


class AdminLoginFailure(models.Model):
    """Failed admin logins for one (username, client address) in the current window.

    The throttle's counter (``effect_broker.admin_login``): in the database, so every
    API process counts the same failures.
    """

    #: SHA-256 of "username\0address": no username typed by a stranger is stored.
    key = models.CharField(max_length=64, primary_key=True)
    failures = models.PositiveIntegerField()
    window_started_at = models.DateTimeField()

    class Meta:
        db_table = "admin_login_failures"


class ConformanceRun(models.Model):
    """One ``contracts conform`` run against a contract version's target (issue 22).

    Not ledger history: a record of what was proved, read by ``doctor`` and by the
    start of ``worker`` / ``serve``, per contract name and version (a new version is
    a new promise and needs its own run).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    contract_name = models.CharField(max_length=200)
    contract_version = models.CharField(max_length=100)
    safety = models.CharField(max_length=32)
    #: The target's origin (scheme://host:port), never a path, key or token.
    target = models.CharField(max_length=300)
    passed = models.BooleanField()
    #: One object per check: check, promise, outcome, evidence.
    rows = models.JSONField()
    effect_requests = models.IntegerField()
    ran_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "conformance_runs"
        indexes = [
            models.Index(
                fields=["contract_name", "contract_version", "-ran_at"],
                name="conformance_runs_latest",
            )
        ]

    def __str__(self) -> str:
        verdict = "passed" if self.passed else "failed"
        return f"{self.contract_name}@{self.contract_version} {verdict}"


class DispatchPause(models.Model):
    """An operator's pause of dispatch for a tool, a contract or a tenant (issue 24).

    Not ledger history, but an audit record all the same: who paused what, when and
    why, and who resumed it. A row is never deleted and is resumed at most once (a
    trigger refuses anything else, migration 0018); the effects it held are listed
    by scope, not linked. At most one active pause per exact scope.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tool = models.TextField(null=True, blank=True)
    contract_name = models.TextField(null=True, blank=True)
    contract_version = models.TextField(null=True, blank=True)
    tenant = models.ForeignKey(
        Tenant,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="dispatch_pauses",
    )
    reason = models.TextField()
    paused_by = models.TextField()
    paused_at = models.DateTimeField()
    resumed_by = models.TextField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)
    resume_reason = models.TextField(default="", blank=True)

    class Meta:
        db_table = "dispatch_pauses"
        constraints = [
            # One active pause per exact scope; NULL ("any") counts as a value.
            models.UniqueConstraint(
                fields=["tool", "contract_name", "contract_version", "tenant"],
                condition=models.Q(resumed_at__isnull=True),
                nulls_distinct=False,
                name="dispatch_pauses_one_active_per_scope",
            ),
            models.CheckConstraint(
                condition=models.Q(tool__isnull=False)
                | models.Q(contract_name__isnull=False)
                | models.Q(tenant__isnull=False),
                name="dispatch_pauses_has_scope",
            ),
            models.CheckConstraint(
                condition=models.Q(contract_version__isnull=True)
                | models.Q(contract_name__isnull=False),
                name="dispatch_pauses_version_needs_name",
            ),
        ]

    def __str__(self) -> str:
        scope = " ".join(
            part
            for part in (
                self.tool and f"tool {self.tool}",
                self.contract_name
                and f"contract {self.contract_name}"
                + (f"@{self.contract_version}" if self.contract_version else ""),
                self.tenant_id and f"tenant {self.tenant_id}",
            )
            if part
        )
        return f"pause of {scope}" + ("" if self.resumed_at is None else " (resumed)")


class ContractLimitState(models.Model):
    """A contract's shared dispatch-limit state: its rate bucket and its waiters'
    cursor (domain/dispatch_limits.py). One row per contract name, written only by
    ``store.dispatch_controls`` under the row's lock."""

    contract_name = models.TextField(primary_key=True)
    tokens = models.FloatField()
    refilled_at = models.DateTimeField()
    next_wake_at = models.DateTimeField()

    class Meta:
        db_table = "contract_limits"

    def __str__(self) -> str:
        return f"limits of {self.contract_name}"
