"""One stdio MCP server process per worker, kept between attempts (issue 22, item 4).

Starting a stdio upstream for every attempt and every lookup costs a process start
(a second and more for a Python server) inside each attempt's time limit, and a burst
of lookups starts a burst of processes. ``StdioSessions`` keeps one initialized
session per adapter (so per worker process and contract version) on an event loop
of its own, in a daemon thread:

* the session is opened on first use; its open (start + initialize) is the "connect"
  phase: a failure there proves ``tools/call`` was never written
  (``UpstreamUnavailable``, retryable);
* before each use a ``ping`` proves the process still answers; one that died (or
  hangs) is discarded and a fresh process started, still before anything is sent;
* after an attempt whose outcome is unknown (no answer, a dropped pipe, a timeout)
  the session is discarded too: a process that lost one answer is not trusted with
  the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio
from mcp import ClientSession

from effect_broker.domain.upstream import McpUpstream

_T = TypeVar("_T")


class StdioSessions:
    """A kept session with one stdio upstream, restarted when its process dies."""

    def __init__(self, upstream: McpUpstream) -> None:
        self.upstream = upstream
        self.starts = 0  # processes started (tests, logs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="mcp-stdio-session", daemon=True
        )
        self._thread.start()
        self._session: ClientSession | None = None
        self._stop: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False

    def run(self, factory: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``factory()`` on the sessions' loop and wait for its result."""
        if self._closed:
            raise RuntimeError("the stdio sessions are closed")

        async def call() -> _T:
            return await factory()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    @asynccontextmanager
    async def session(self, connect_timeout: float) -> AsyncIterator[ClientSession]:
        """The kept session (opened, or replaced when it does not answer a ping);
        ``UpstreamUnavailable`` when no process can be started and initialized."""
        session = await self._ensure(connect_timeout)
        try:
            yield session
        except BaseException:
            await self.discard()
            raise

    async def _ensure(self, timeout: float) -> ClientSession:
        from effect_broker.adapters.mcp_adapter import UpstreamUnavailable

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._session is not None and self._holder and not self._holder.done():
                try:
                    with anyio.fail_after(max(0.1, timeout)):
                        await self._session.send_ping()
                except Exception:
                    await self._discard_locked()
                else:
                    return self._session
            else:
                await self._discard_locked()
            ready: asyncio.Future[ClientSession] = self._loop.create_future()
            self._stop = asyncio.Event()
            self._holder = self._loop.create_task(self._hold(ready, self._stop, timeout))
            self.starts += 1
            try:
                self._session = await ready
            except UpstreamUnavailable:
                self._session = None
                raise
            return self._session

    async def _hold(
        self, ready: asyncio.Future[ClientSession], stop: asyncio.Event, timeout: float
    ) -> None:
        # The transports' contexts are entered and left by this one task, as anyio
        # requires; other tasks only send requests through the session.
        from effect_broker.adapters.mcp_adapter import UpstreamUnavailable, open_upstream

        try:
            async with open_upstream(self.upstream, timeout) as session:
                ready.set_result(session)
                await stop.wait()
        except UpstreamUnavailable as exc:
            if not ready.done():
                ready.set_exception(exc)
        except BaseException as exc:  # the process died: the session is over
            if not ready.done():
                ready.set_exception(UpstreamUnavailable(f"{type(exc).__name__}"))

    async def discard(self) -> None:
        """Stop the kept process; the next use starts a new one."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await self._discard_locked()

    async def _discard_locked(self) -> None:
        holder, stop = self._holder, self._stop
        self._session = self._holder = self._stop = None
        if holder is None or stop is None:
            return
        stop.set()
        try:
            with anyio.move_on_after(5):
                await asyncio.shield(holder)
        except BaseException:  # noqa: S110 - a dying process's teardown may fail
            pass
        if not holder.done():
            holder.cancel()

    def close(self) -> None:
        """Stop the process and the loop (idempotent)."""
        if self._closed:
            return
        self._closed = True
        # Closing must not fail a shutdown, whatever the dying process does.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.discard(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()


__all__ = ["StdioSessions"]
