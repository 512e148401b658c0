"""Process-wide collaborators of the services: contracts, keys and the clock.

They are built once from settings. Tests swap them with ``override()`` rather than
monkeypatching module internals.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings

from effect_broker.domain.argument_limits import ArgumentLimits
from effect_broker.domain.clock import Clock, SystemClock
from effect_broker.domain.contracts import (
    ContractRegistry,
    EffectContract,
    load_contracts,
)
from effect_broker.domain.errors import (
    ConfigurationError,
    ContractError,
    ContractsUnavailableError,
)
from effect_broker.domain.keys import derive_tenant_hmac_key
from effect_broker.domain.payload_crypto import Keyring, derive_payload_key
from effect_broker.scheduling import ProcrastinateScheduler
from effect_broker.services import secrets
from effect_broker.services.secrets import SecretSource

if TYPE_CHECKING:
    from effect_broker.adapters.base import EffectAdapter
    from effect_broker.store.ledger import QueuedJob

logger = logging.getLogger(__name__)


class Scheduler(Protocol):
    """Where the services ask for future work; the real one defers procrastinate jobs
    on the caller's database connection, so a deferral commits with the ledger write."""

    def dispatch(self, effect_id: str, *, at: datetime | None = None) -> None:
        """Ask for ``dispatch_effect(effect_id)`` to run (at ``at``, or now)."""
        ...

    def reconcile(self, effect_id: str, *, at: datetime | None = None) -> None:
        """Ask for ``reconcile_effect(effect_id)`` to run (at ``at``, or now)."""
        ...

    def reservation_job(self, effect_id: str) -> QueuedJob | None:
        """The dispatch job of a new effect as a row its reservation statement inserts
        (one round trip, one commit), or None: then submit calls ``dispatch``."""
        ...

    def approval_notice_job(self, effect_id: str) -> QueuedJob | None:
        """The operators' notice of a new effect awaiting approval, as a row its
        reservation inserts, or None: then submit calls ``notify_approval``."""
        ...

    def notify_approval(self, effect_id: str) -> None:
        """Ask for ``notify_approval(effect_id)``: the approval webhook (issue 24)."""
        ...


@dataclass(frozen=True)
class EngineTiming:
    """Lease and recovery timing (see docs/explanation/workers.md)."""

    #: How long a claim on an effect is valid without a heartbeat.
    lease: timedelta = timedelta(seconds=30)
    #: How often a dispatching worker extends its lease during long I/O (0: never).
    heartbeat: timedelta = timedelta(seconds=10)
    #: The send gate refuses to send with less than this left on the lease (measured
    #: on the monotonic clock from before the claim was sent); a negative lookup
    #: after a lost attempt waits this much longer than the settlement bound.
    send_margin: timedelta = timedelta(seconds=2)
    #: Stop redispatching an idempotent effect this long before its key expires.
    retention_margin: timedelta = timedelta(seconds=60)
    #: How long past its settlement deadline an inconclusive probe keeps retrying.
    reconcile_window: timedelta = timedelta(hours=1)
    #: Due work older than this with no job is re-deferred by the sweeper.
    redefer_grace: timedelta = timedelta(seconds=10)


@dataclass(frozen=True)
class Runtime:
    """The services' view of configuration."""

    registry: ContractRegistry
    master_key: bytes
    keyring: Keyring
    clock: Clock
    scheduler: Scheduler
    adapter_for: Callable[[EffectContract], EffectAdapter]
    timing: EngineTiming
    argument_limits: ArgumentLimits = field(default_factory=ArgumentLimits)
    #: Where a dispatching worker finds referenced secrets (services/secrets.py).
    secrets: SecretSource = field(default_factory=SecretSource)

    def tenant_hmac_key(self, hmac_key_id: str) -> bytes:
        """Derive a tenant's downstream-key HMAC key from the master key."""
        return derive_tenant_hmac_key(self.master_key, hmac_key_id)


_lock = threading.Lock()
_current: Runtime | None = None


def _payload_keyring(hash_root: bytes) -> Keyring:
    """Data keys for every master key in the keyring (settings.EFFECT_BROKER_MASTER_KEYS),
    the current one active; just the one key when settings were built without it."""
    keys = getattr(settings, "EFFECT_BROKER_MASTER_KEYS", None)
    if keys is None:
        return Keyring.from_master_key(hash_root)
    return Keyring(
        active_key_id=keys.current_id,
        keys={kid: derive_payload_key(master, kid) for kid, master in keys.entries},
    )


def configured_keyring() -> Keyring | None:
    """The payload keyring the settings describe (None without a master key): what
    ``doctor`` checks stored ciphertexts against, without loading contracts."""
    master = settings.EFFECT_BROKER_MASTER_KEY
    return None if master is None else _payload_keyring(master)


def _build() -> Runtime:
    master = settings.EFFECT_BROKER_MASTER_KEY
    if master is None:
        raise ConfigurationError("no master key configured (EFFECT_BROKER_MASTER_KEY)")
    from effect_broker.adapters.registry import build_adapter

    timing = settings.EFFECT_BROKER_TIMING
    return Runtime(
        registry=_load_registry(),
        master_key=master,
        keyring=_payload_keyring(master),
        clock=SystemClock(),
        scheduler=ProcrastinateScheduler(),
        adapter_for=build_adapter,
        timing=EngineTiming(
            lease=timedelta(seconds=timing["lease_seconds"]),
            heartbeat=timedelta(seconds=timing["heartbeat_seconds"]),
            send_margin=timedelta(seconds=timing["send_margin_seconds"]),
            retention_margin=timedelta(seconds=timing["retention_margin_seconds"]),
            reconcile_window=timedelta(seconds=timing["reconcile_window_seconds"]),
            redefer_grace=timedelta(seconds=timing["redefer_grace_seconds"]),
        ),
        argument_limits=ArgumentLimits(**settings.EFFECT_BROKER_ARGUMENT_LIMITS),
        secrets=secrets.from_settings(),
    )


def _load_registry() -> ContractRegistry:
    """The deployment's contracts; a broken file is the operator's to fix.

    Its error names the file, the contract and the field (a server path, maybe a
    schema file's too): that goes to this process's log. Whoever asked - a tenant's
    submit or history, an agent's tool call - gets ``ContractsUnavailableError``, a
    503 naming no path (issue 19, item 12: it was a 500 with the path in it).
    """
    try:
        return load_contracts(settings.EFFECT_BROKER_CONTRACTS)
    except ContractError as exc:
        logger.error(
            "contracts file cannot be loaded: %s",
            exc,
            extra={"action": "contracts", "code": exc.code},
        )
        raise ContractsUnavailableError() from exc


def get_runtime() -> Runtime:
    """Return the process runtime, loading contracts and keys on first use."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                _current = _build()
    return _current


@contextmanager
def override(
    *,
    registry: ContractRegistry | None = None,
    clock: Clock | None = None,
    scheduler: Scheduler | None = None,
    adapter_for: Callable[[EffectContract], EffectAdapter] | None = None,
    timing: EngineTiming | None = None,
    secrets: SecretSource | None = None,
) -> Iterator[Runtime]:
    """Temporarily replace collaborators (tests, simulations); restores them after."""
    global _current
    previous = get_runtime()
    changes: dict[str, Any] = {
        "registry": registry,
        "clock": clock,
        "scheduler": scheduler,
        "adapter_for": adapter_for,
        "timing": timing,
        "secrets": secrets,
    }
    changed = replace(previous, **{k: v for k, v in changes.items() if v is not None})
    _current = changed
    try:
        yield changed
    finally:
        _current = previous


def reset() -> None:
    """Forget the cached runtime (after settings change in tests)."""
    global _current
    _current = None
