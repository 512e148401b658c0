"""Keeping a dispatch lease alive during long I/O, and proving it before every send.

Issue "correctness at the edges", defect 1: a worker that committed its claim and then
stalled (GC pause, VM stall, SIGSTOP) past its lease woke up and sent its request after
the sweeper had handed the effect on: two charges. A fenced ledger write cannot stop
that, because the target call happens before the write. So the worker must prove, right
before the request is written, that its lease still holds, on a clock that cannot be
set and counts a suspend of the host (``domain.clock.lease_seconds``: CLOCK_BOOTTIME on
Linux; ``time.monotonic()`` stood still while a host was suspended, issue 19):

* ``claimed_at`` is read from that clock BEFORE the claim statement is sent,
  so it is no later than the moment the database started the lease;
* the lease is provably held until ``claimed_at + lease - send_margin`` (each fenced
  heartbeat moves that point: its own send time + lease - margin);
* the send gate (``check``) refuses once that point has passed, once a heartbeat was
  refused by the fence (the lease was taken away), or once the attempt's total time
  limit is spent. A refusal raises ``SendRefusedError``: nothing was sent.

What no local check can close: a stall between the gate's last check and the socket
write (the HTTP adapter makes that check immediately before its one write of headers
and body). The send margin is the budget for that window (docs/explanation/guarantees.md).

The beats come from one thread per process (``services.lease_heartbeat``), not a thread
per dispatch: a keeper registers for the length of its call.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from types import TracebackType

from django.db import connection

from effect_broker import store
from effect_broker.domain.errors import SendRefusedError, StaleWriteError
from effect_broker.domain.records import EffectRecord
from effect_broker.services.deadlines import lease_until
from effect_broker.services.lease_heartbeat import HEARTBEATS
from effect_broker.services.runtime import Runtime

logger = logging.getLogger(__name__)


class LeaseKeeper:
    """The send gate of one attempt, and the heartbeat that keeps its lease.

    Every extension is a compare-and-swap like any other write, so the keeper always
    holds the newest version; ``current()`` hands it to the writer of the outcome. An
    extension refused by the fence means the lease was taken away: the gate closes for
    good. A transient database error is logged and retried at the next beat: the lease
    may still be valid, and the gate's own deadline decides whether it is.
    """

    def __init__(
        self,
        rt: Runtime,
        record: EffectRecord,
        *,
        worker: str,
        claimed_at: float,
        attempt_limit: timedelta,
    ) -> None:
        self._rt = rt
        self._record = record
        self._worker = worker
        self._margin = rt.timing.send_margin.total_seconds()
        self._lease = rt.timing.lease.total_seconds()
        self._provable_until = claimed_at + self._lease - self._margin
        self._deadline = claimed_at + attempt_limit.total_seconds()
        self._lock = threading.Lock()
        self._registered = False
        self.lost = False

    def __enter__(self) -> LeaseKeeper:
        interval = self._rt.timing.heartbeat.total_seconds()
        if interval > 0:
            HEARTBEATS.add(self, interval)
            self._registered = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._registered:
            # Waits for a beat in flight, so current() is the newest version.
            HEARTBEATS.remove(self)
            self._registered = False

    # --- the send gate (adapters.base.SendGate) -----------------------------------

    def check(self) -> None:
        """Raise ``SendRefusedError`` unless the lease is provably held right now."""
        now = self._rt.clock.monotonic()
        with self._lock:
            lost, provable_until = self.lost, self._provable_until
        if lost:
            reason, detail = "lease_lost", "another worker took the lease over"
        elif now >= self._deadline:
            reason, detail = "attempt_time_limit", "the attempt's time limit is spent"
        elif now >= provable_until:
            reason = "lease_unproven"
            detail = (
                f"the lease cannot be proved: {now - provable_until:.3f}s past the "
                "last moment it was known to hold (less the send margin)"
            )
        else:
            return
        logger.warning(
            "send refused",
            extra={
                "action": "send_refused",
                "effect_id": self._record.effect_id,
                "reason": reason,
            },
        )
        raise SendRefusedError(f"send refused: {detail}; nothing was sent", reason=reason)

    def remaining(self) -> float:
        """Seconds left of the attempt's total time limit."""
        return max(0.0, self._deadline - self._rt.clock.monotonic())

    # --- the heartbeat ------------------------------------------------------------

    def current(self) -> EffectRecord:
        """The newest version this worker wrote."""
        with self._lock:
            return self._record

    def beat_due(self) -> bool:
        """Called by the heartbeat thread when a beat is due; False: beat no more."""
        if self._rt.clock.monotonic() >= self._deadline + self._margin:
            # The adapter overran its own limit: stop vouching for it, so the
            # lease lapses and the sweeper records the outcome as unknown.
            return False
        return self._beat()

    def _beat(self) -> bool:
        """Extend the lease once; False when it was taken away (stop beating)."""
        sent_at = self._rt.clock.monotonic()
        record = self.current()
        try:
            extended = store.touch(
                record,
                event_type="lease_extended",
                actor=self._worker,
                now=self._rt.clock.now(),
                changes={"lease_expires_at": lease_until(self._rt)},
            )
        except StaleWriteError:
            with self._lock:
                self.lost = True
            logger.warning(
                "lease lost during dispatch",
                extra={"action": "lease_lost", "effect_id": record.effect_id},
            )
            return False
        except Exception:
            # A transient database error (a restart, a dropped connection) does not
            # mean the lease is gone: keep the gate's deadline where it is and try
            # again at the next beat, on a fresh connection.
            logger.warning(
                "lease extension failed; retrying at the next heartbeat",
                exc_info=True,
                extra={"action": "lease_extension_failed", "effect_id": record.effect_id},
            )
            connection.close()
            return True
        with self._lock:
            self._record = extended
            self._provable_until = sent_at + self._lease - self._margin
        return True
