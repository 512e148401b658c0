"""Wait a bounded time for an effect to settle, woken by its change notifications.

The MCP proxy tools (issue 10, item 3) answer a call with the effect's outcome when it
comes quickly, and with "still running, call again with the same key" when it does not;
the REST long-poll ``GET /v1/effects/{id}/wait`` (issue 23) answers with the effect once
a wait for ``until`` ends there (``domain.waits``: a final state, or also one only an
operator can leave), or at its deadline. Waiting is on PostgreSQL LISTEN/NOTIFY
(``store.changes``), not polling: the row is re-read when a notification names this
effect.

One LISTEN connection serves every waiter of a process (``ChangeHub``): a waiting call
holds no database connection and no thread while it waits, so a hundred agents
waiting cost one backend, not a hundred. The hub's reader task fans each notification
out to the waiters of that effect. If its connection drops, the hub wakes every waiter
(a notification may have been lost with it) and reconnects with backoff; until it is
back, waiters re-read their row every ``RECHECK_SECONDS``, and every wait ends with a
read at its deadline, so a missed notification can delay an answer, never hang it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
from django.db import connections

from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.domain.waits import Until, stops
from effect_broker.models import Tenant
from effect_broker.services import inspection
from effect_broker.store.changes import listen, open_listener

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Final states: nothing automatic changes them.
FINAL = frozenset(
    {EffectStatus.SUCCEEDED, EffectStatus.FAILED_FINAL, EffectStatus.COMPENSATED}
)

#: How often a waiter re-reads its row while the hub is not listening.
RECHECK_SECONDS = 1.0
#: Idle time after which the hub re-issues LISTEN, to find a dead connection (one
#: whose peer vanished without a FIN) before a waiter depends on it.
PROBE_SECONDS = 10.0
#: Reconnect backoff: first delay, doubled per failure up to the cap.
BACKOFF_FIRST_SECONDS = 0.2
BACKOFF_MAX_SECONDS = 5.0


def stops_waiting(until: Until, record: EffectRecord) -> bool:
    """True when a wait for ``until`` ends at ``record`` (``domain.waits.stops``)."""
    return stops(
        until,
        final=record.status in FINAL,
        needs_operator=inspection.needs_operator(record),
    )


def settled_for_caller(record: EffectRecord) -> bool:
    """True when waiting longer cannot help the caller: the effect is final, or only an
    operator can move it on (an unsafe unknown outcome, manual review). A reconcilable
    or idempotent unknown outcome is still being worked on, so it is worth waiting for."""
    return stops_waiting(Until.ANSWER, record)


class ChangeHub:
    """This process's one LISTEN connection, fanning changes out to waiters.

    Bound to the event loop it was started on (``change_hub``). Started on the first
    ``subscribe``; ``aclose`` stops it.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self._listening = False
        #: Connections opened so far (1 + reconnects); for tests and metrics.
        self.connects = 0

    @property
    def listening(self) -> bool:
        """True while the LISTEN connection is up: a change will wake its waiters."""
        return self._listening

    @contextlib.contextmanager
    def subscribe(self, effect_id: str) -> Iterator[asyncio.Event]:
        """An event set on every change of ``effect_id`` (and whenever the hub may
        have missed one) for the duration of the block."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="effect-change-hub")
        event = asyncio.Event()
        self._waiters.setdefault(effect_id, set()).add(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(effect_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[effect_id]

    async def aclose(self) -> None:
        """Stop listening and close the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _wake(self, effect_id: str) -> None:
        for event in self._waiters.get(effect_id, ()):
            event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def _run(self) -> None:
        delay = BACKOFF_FIRST_SECONDS
        while True:
            try:
                conn = await open_listener()
            except Exception as exc:
                logger.warning(
                    "change listener cannot connect; waiters re-check instead",
                    extra={"action": "change_listener", "error": type(exc).__name__},
                )
            else:
                self.connects += 1
                try:
                    self._listening = True
                    delay = BACKOFF_FIRST_SECONDS
                    # Anything committed while nobody listened is in a fresh read.
                    self._wake_all()
                    await self._pump(conn)
                except Exception as exc:
                    logger.warning(
                        "change listener lost its connection; reconnecting",
                        extra={"action": "change_listener", "error": type(exc).__name__},
                    )
                finally:
                    self._listening = False
                    # A notification may have gone down with the connection.
                    self._wake_all()
                    with contextlib.suppress(Exception):
                        await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_SECONDS)

    async def _pump(self, conn: Any) -> None:
        while True:
            async for note in conn.notifies(timeout=PROBE_SECONDS):
                self._wake(note.payload)
            await listen(conn)  # raises on a dead connection


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ChangeHub] = (
    weakref.WeakKeyDictionary()
)


def change_hub() -> ChangeHub:
    """The running event loop's hub (one per process in a server: one loop)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = ChangeHub()
    return hub


async def close_change_hub() -> None:
    """Close the running loop's hub, if it has one (at server shutdown)."""
    hub = _hubs.pop(asyncio.get_running_loop(), None)
    if hub is not None:
        await hub.aclose()


async def wait_until_settled(
    tenant: Tenant,
    effect_id: str,
    timeout: float,
    *,
    stop: Callable[[EffectRecord], bool] = settled_for_caller,
) -> EffectRecord:
    """Return ``tenant``'s effect once ``stop`` holds for it (by default: settled for
    its caller), or as it is when ``timeout`` seconds have passed.

    Every state a ``stop`` of ``stops_waiting`` can end in is one migration 0014
    notifies (``tests/unit/test_change_notify_states.py``), so the wait is woken by the
    change that ends it, not found by the re-check.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    hub = change_hub()
    with hub.subscribe(effect_id) as changed:
        # Read after subscribing: a change committed before is in this read, and
        # one committed after wakes ``changed`` (or the re-check reads it).
        record = await _read(tenant, effect_id)
        while not stop(record):
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            bound = remaining if hub.listening else min(remaining, RECHECK_SECONDS)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(bound):
                    await changed.wait()
            changed.clear()
            # One read per wake-up or re-check, and one at the deadline: the caller
            # gets the state as it is when the wait ends.
            record = await _read(tenant, effect_id)
    return record


async def _read(tenant: Tenant, effect_id: str) -> EffectRecord:
    return await in_thread(inspection.get_effect, tenant, effect_id)


async def in_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """Run the synchronous Django code ``fn(*args)`` in a worker thread, and give back
    the database connection it took before the thread is reused.

    Every piece of Django code an async surface runs off the event loop (an MCP tool's
    service call, a key check, a waiter's read) goes through here: nothing else
    returns such a connection. Issue 19: the MCP key check ran on a bare worker
    thread, and each of anyio's 40 threads kept the pooled connection it drew, for
    good: 40 bad keys emptied the API's pool (every REST call a 503 until restart),
    and left the standalone server with 38 idle PostgreSQL connections.
    """

    def run() -> _T:
        try:
            return fn(*args)
        finally:
            # Between reads a waiter holds no connection (module docstring); worker
            # threads come and go, and a connection left on one would outlive it
            # unclosed (a pooled one would never be lent again). Closing returns a
            # pooled connection to the pool; one connection per call is cheap.
            connections.close_all()

    return await anyio.to_thread.run_sync(run)
