"""``InProcessClient``: the SDK's interface for a Django project that installs the
``effect_broker`` app, calling the services directly - no HTTP, no API key on the
wire, the same models and the same typed errors as ``BrokerClient``.

This is the one module of ``effect_broker.client`` that imports Django and the
services; ``effect_broker.client`` loads it only when ``InProcessClient`` is first
used, so an agent process without Django still imports the SDK. Like the API, it is a
surface: it calls one service per method and maps domain errors in one place.

Its ``wait`` reads the ledger; the effect is dispatched by the project's procrastinate
worker, as for an HTTP submit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from effect_broker.client.base import SyncBrokerOps
from effect_broker.client.errors import from_domain
from effect_broker.client.models import (
    BatchItem,
    BatchResult,
    Effect,
    History,
    HistoryEvent,
    Paused,
    Receipt,
)
from effect_broker.domain.errors import EffectBrokerError
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import Tenant
from effect_broker.services import inspection, pauses
from effect_broker.services.batch_submission import CREATED, REPLAYED, submit_many
from effect_broker.services.submission import submit
from effect_broker.services.tenants import authenticate


@contextmanager
def _typed_errors() -> Iterator[None]:
    """Raise the SDK's exception for a domain error, as the HTTP client would."""
    try:
        yield
    except EffectBrokerError as exc:
        raise from_domain(exc) from exc


def _wire_time(value: datetime) -> datetime:
    """``value`` as the HTTP API sends it: Django's JSON encoder keeps milliseconds,
    and the models are the API's answers, so both clients hand back equal values."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _optional_wire_time(value: datetime | None) -> datetime | None:
    return None if value is None else _wire_time(value)


def _effect(record: EffectRecord, **extra: Any) -> Effect:
    return Effect(
        effect_id=record.effect_id,
        operation_key=record.operation_key,
        tool=record.tool,
        contract=f"{record.contract_name}@{record.contract_version}",
        safety_class=record.safety.value,
        status=record.status.value,
        version=record.version,
        attempt_count=record.attempt_count,
        arguments_preview=dict(record.arguments_preview),
        receipt_id=record.receipt_id,
        created_at=_wire_time(record.created_at),
        updated_at=_wire_time(record.updated_at),
        outcome_in_doubt=record.outcome_in_doubt,
        approval_deadline=_optional_wire_time(
            record.next_action_at
            if record.status is EffectStatus.AWAITING_APPROVAL
            else None
        ),
        **extra,
    )


class InProcessClient(SyncBrokerOps):
    """The SDK interface on the services, for one tenant (a ``Tenant`` row)."""

    def __init__(
        self, tenant: Tenant, *, sleep: Callable[[float], None] | None = None
    ) -> None:
        self.tenant = tenant
        if sleep is not None:
            self._sleep = sleep

    @classmethod
    def for_api_key(cls, api_key: str) -> InProcessClient:
        """The client of the tenant owning ``api_key`` (``Unauthenticated`` if none)."""
        with _typed_errors():
            return cls(authenticate(api_key))

    def submit(
        self,
        operation_key: str,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        trace_id: str | None = None,
        requested_by: str = "",
    ) -> Effect:
        """Reserve, or replay the effect this operation key names (the service behind
        ``POST /v1/effects``)."""
        request = EffectRequest(
            operation_key=operation_key,
            tool=tool,
            arguments=arguments,
            requested_by=requested_by,
            trace_id=trace_id,
        )
        with _typed_errors():
            reservation = submit(self.tenant, request)
        return _effect(
            reservation.effect, created=reservation.created, replayed=reservation.replayed
        )

    def submit_many(self, items: Sequence[BatchItem]) -> list[BatchResult]:
        """Reserve many effects in one commit, a result per item (the service behind
        ``POST /v1/effects/batch``); see ``BrokerClient.submit_many``."""
        requests = [
            EffectRequest(
                operation_key=item.operation_key,
                tool=item.tool,
                arguments=item.arguments,
                requested_by=item.requested_by,
                trace_id=item.trace_id,
            )
            for item in items
        ]
        with _typed_errors():
            results = submit_many(self.tenant, requests)
        return [
            BatchResult(
                index=r.index,
                outcome=r.outcome,
                effect=None
                if r.effect is None
                else _effect(
                    r.effect, created=r.outcome == CREATED, replayed=r.outcome == REPLAYED
                ),
                error=None if r.error is None else from_domain(r.error),
            )
            for r in results
        ]

    def get(self, effect_id: str) -> Effect:
        """One effect of this tenant, with its fork links."""
        with _typed_errors():
            record = inspection.get_effect(self.tenant, effect_id)
            links = inspection.fork_links(record)
            held = pauses.pause_holding(record)
        return _effect(
            record,
            forked_from=links.forked_from,
            forked_to=links.forked_to,
            paused=None
            if held is None
            else Paused(
                reason=held.reason,
                since=_wire_time(held.paused_at),
                scope=held.scope.describe(),
            ),
        )

    def receipt(self, effect_id: str) -> Receipt:
        """The receipt of a succeeded effect (``EffectNotFound`` while none)."""
        with _typed_errors():
            stored = inspection.get_receipt(self.tenant, effect_id)
        return Receipt(
            receipt_id=stored.receipt_id,
            effect_id=stored.effect_id,
            external_id=stored.external_id,
            result=dict(stored.result),
            result_preview=dict(stored.result_preview),
            evidence_digest=stored.evidence_digest,
            target_timestamp=_optional_wire_time(stored.target_timestamp),
            contract_version=stored.contract_version,
            downstream_key_digest=stored.downstream_key_digest,
            created_at=_wire_time(stored.created_at),
        )

    def history(self, effect_id: str, at_sequence: int | None = None) -> History:
        """The effect folded from its verified events (up to ``at_sequence``)."""
        with _typed_errors():
            folded = inspection.history(self.tenant, effect_id, at_sequence)
        return History(
            effect_id=folded.effect_id,
            at_sequence=folded.at_sequence,
            latest_sequence=folded.latest_sequence,
            status=folded.status.value,
            version=folded.version,
            # history() raises event_chain_broken rather than return an unverified chain.
            chain_verified=True,
            events=tuple(
                HistoryEvent(
                    sequence=e.facts.sequence,
                    event_type=e.facts.event_type,
                    old_status=e.facts.old_status,
                    new_status=e.facts.new_status,
                    version=e.facts.version,
                    actor=e.facts.actor,
                    occurred_at=_wire_time(e.facts.occurred_at),
                    metadata=dict(e.facts.metadata),
                    digest=e.digest.hex(),
                )
                for e in folded.events
            ),
        )
