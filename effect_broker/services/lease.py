"""Keeping a dispatch lease alive during long I/O, with every extension fenced."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from django.db import connection

from effect_broker import store
from effect_broker.domain.errors import StaleWriteError
from effect_broker.domain.records import EffectRecord
from effect_broker.services.runtime import Runtime

logger = logging.getLogger(__name__)


class LeaseKeeper:
    """Extends ``lease_expires_at`` every ``timing.heartbeat`` while a call is in flight.

    Each extension is a compare-and-swap like any other write, so the keeper always
    holds the newest version; ``current()`` hands it to the writer of the outcome. If an
    extension is refused (the sweeper already declared the lease expired), the keeper
    stops and the outcome write will be refused too: a paused worker cannot win.
    """

    def __init__(self, rt: Runtime, record: EffectRecord, *, worker: str) -> None:
        self._rt = rt
        self._record = record
        self._worker = worker
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False

    def __enter__(self) -> LeaseKeeper:
        interval = self._rt.timing.heartbeat.total_seconds()
        if interval > 0:
            self._thread = threading.Thread(
                target=self._run, args=(interval,), name="lease-keeper", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def current(self) -> EffectRecord:
        """The newest version this worker wrote."""
        with self._lock:
            return self._record

    def _run(self, interval: float) -> None:
        try:
            while not self._stop.wait(interval):
                with self._lock:
                    now = self._rt.clock.now()
                    try:
                        self._record = store.touch(
                            self._record,
                            event_type="lease_extended",
                            actor=self._worker,
                            now=now,
                            changes={"lease_expires_at": now + self._rt.timing.lease},
                        )
                    except StaleWriteError:
                        self.lost = True
                        logger.warning(
                            "lease lost during dispatch",
                            extra={
                                "action": "lease_lost",
                                "effect_id": self._record.effect_id,
                            },
                        )
                        return
        finally:
            # This thread's Django connection must not outlive it.
            connection.close()
