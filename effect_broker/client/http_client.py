"""``BrokerClient`` and ``AsyncBrokerClient``: the broker's HTTP API on httpx.

Every request goes through one ``_send`` that resends on transport errors and 5xx
(and a 429 with ``Retry-After``) under a ``RetryPolicy``. Resending a submit is safe
because the operation key, not the request, is the effect's identity: a resend
reserves the effect or replays it, never a second one (``retrying`` says more).

``wait`` waits on the broker's long-poll, ``GET /v1/effects/{id}/wait``, woken by
the effect's change; a broker without it (older than the SDK: a 404
``route_not_found``) is read with ``GET /v1/effects/{id}`` on ``wait``'s schedule
instead, once found out, for the rest of the client's life.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import httpx

from effect_broker.client import wire
from effect_broker.client.base import AsyncBrokerOps, SyncBrokerOps
from effect_broker.client.errors import RouteNotFound
from effect_broker.client.models import BatchItem, BatchResult, Effect, History, Receipt
from effect_broker.client.retrying import (
    RetryPolicy,
    is_transient,
    retry_after_seconds,
    should_resend,
)
from effect_broker.domain.waits import Until

logger = logging.getLogger(__name__)

#: Seconds one HTTP request may take (connect, write, read), not a whole wait.
DEFAULT_TIMEOUT = 10.0


def _log_resend(method: str, path: str, resend: int, why: str, wait: float) -> None:
    # Never the body, the key or the API key (STYLE rule 8).
    logger.warning(
        "resending %s %s in %.2fs (%s)",
        method,
        path,
        wait,
        why,
        extra={"action": "client_resend", "resend": resend + 1, "reason": why},
    )


class _Resends:
    """When a request is sent again: the decision both clients' ``_send`` loops share
    (they differ only in how they wait and close)."""

    def __init__(self, retry: RetryPolicy, rand: Callable[[], float]) -> None:
        self.retry = retry
        self.rand = rand

    def last(self, resend: int) -> bool:
        """Whether this is the last attempt the policy allows."""
        return resend + 1 >= self.retry.attempts

    def after_error(
        self, method: str, path: str, resend: int, exc: httpx.TransportError
    ) -> tuple[float, str]:
        """The wait before resending after ``exc``; raises when it is not resent."""
        if self.last(resend) or not is_transient(exc):
            raise wire.transport_error(f"{method} {path}", exc) from exc
        return self.retry.delay(resend, rand=self.rand), type(exc).__name__

    def after_answer(
        self, resend: int, response: httpx.Response
    ) -> tuple[float, str] | None:
        """The wait before resending after ``response``; None: it is the answer."""
        if self.last(resend) or not should_resend(response):
            return None
        wait = self.retry.delay(
            resend, retry_after=retry_after_seconds(response), rand=self.rand
        )
        return wait, f"HTTP {response.status_code}"


class BrokerClient(SyncBrokerOps):
    """The broker's HTTP API for one tenant, synchronous.

    ``BrokerClient("https://broker.example", api_key)``; use it as a context manager
    or call ``close()``. ``http_client`` replaces the httpx client (its base URL,
    headers and transport are then the caller's: tests pass a ``MockTransport``).
    Environment proxy variables are not read; pass ``proxy=`` when one is needed.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        proxy: str | None = None,
        http_client: httpx.Client | None = None,
        sleep: Callable[[float], None] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._retry = retry or RetryPolicy()
        self._rand = rand
        if sleep is not None:
            self._sleep = sleep
        self._http = http_client or httpx.Client(
            base_url=base_url,
            headers=wire.headers(api_key),
            timeout=timeout,
            # retries=0: the SDK alone decides what is resent (see ``retrying``).
            transport=httpx.HTTPTransport(retries=0, proxy=proxy),
        )
        if http_client is not None:
            self._http.headers.update(wire.headers(api_key))
        #: False once the broker answered the long-poll with route_not_found.
        self._long_poll = True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def submit(
        self,
        operation_key: str,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        trace_id: str | None = None,
        requested_by: str = "",
    ) -> Effect:
        """``POST /v1/effects``: reserve, or replay the effect this key names.

        Resent on transport errors and 5xx (safe: the key makes a resend a replay);
        ``PayloadConflict`` when the key names an effect with other arguments.
        """
        body = wire.submit_body(
            operation_key, tool, arguments, trace_id=trace_id, requested_by=requested_by
        )
        return Effect.from_wire(
            self._send(
                "POST",
                wire.EFFECTS,
                content=body,
                headers=wire.idempotency_key_header(operation_key),
            )
        )

    def submit_many(self, items: Sequence[BatchItem]) -> list[BatchResult]:
        """``POST /v1/effects/batch``: reserve many effects in one request and one
        commit; a ``BatchResult`` per item, in order (created, replayed or conflict).

        An invalid item refuses the whole batch (its typed error, ``extras["item"]``
        its index), and nothing is written. Resent like ``submit``: every item is
        keyed, so a resend replays what the first attempt reserved.
        """
        body = wire.batch_body(items)
        return wire.batch_results(self._send("POST", wire.EFFECTS_BATCH, content=body))

    def get(self, effect_id: str) -> Effect:
        """``GET /v1/effects/{id}``."""
        return Effect.from_wire(self._send("GET", wire.effect_path(effect_id)))

    def _watch(self, effect_id: str, seconds: float, until: Until) -> Effect:
        """``GET /v1/effects/{id}/wait``: the broker answers when the effect reaches a
        state ``until`` stops at, or after ``seconds`` (at most its cap)."""
        if self._long_poll and seconds > 0:
            try:
                return Effect.from_wire(
                    self._send(
                        "GET",
                        wire.effect_path(effect_id, wire.WAIT),
                        params=wire.wait_params(seconds, until),
                        timeout=wire.long_poll_timeout(self._http.timeout, seconds),
                    )
                )
            except RouteNotFound:
                self._long_poll = False  # an older broker: read on wait's schedule
        return self.get(effect_id)

    def receipt(self, effect_id: str) -> Receipt:
        """``GET /v1/effects/{id}/receipt`` (``EffectNotFound`` while there is none)."""
        return Receipt.from_wire(
            self._send("GET", wire.effect_path(effect_id, "receipt"))
        )

    def history(self, effect_id: str, at_sequence: int | None = None) -> History:
        """``GET /v1/effects/{id}/history[?at_sequence=N]``."""
        params = {} if at_sequence is None else {"at_sequence": at_sequence}
        return History.from_wire(
            self._send("GET", wire.effect_path(effect_id, "history"), params=params)
        )

    def _send(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> Any:
        resends = _Resends(self._retry, self._rand)
        resend = 0
        while True:
            try:
                response = self._http.request(
                    method,
                    path,
                    content=content,
                    params=params,
                    headers={
                        **({"Content-Type": "application/json"} if content else {}),
                        **(headers or {}),
                    },
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
                )
            except httpx.TransportError as exc:
                wait, why = resends.after_error(method, path, resend, exc)
            else:
                step = resends.after_answer(resend, response)
                if step is None:
                    return wire.answer(response)
                wait, why = step
                response.close()
            _log_resend(method, path, resend, why, wait)
            self._sleep(wait)
            resend += 1


class AsyncBrokerClient(AsyncBrokerOps):
    """The broker's HTTP API for one tenant, on asyncio; see ``BrokerClient``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        proxy: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._retry = retry or RetryPolicy()
        self._rand = rand
        if sleep is not None:
            self._sleep = sleep
        self._http = http_client or httpx.AsyncClient(
            base_url=base_url,
            headers=wire.headers(api_key),
            timeout=timeout,
            transport=httpx.AsyncHTTPTransport(retries=0, proxy=proxy),
        )
        if http_client is not None:
            self._http.headers.update(wire.headers(api_key))
        #: False once the broker answered the long-poll with route_not_found.
        self._long_poll = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def submit(
        self,
        operation_key: str,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        trace_id: str | None = None,
        requested_by: str = "",
    ) -> Effect:
        """``POST /v1/effects``; see ``BrokerClient.submit``."""
        body = wire.submit_body(
            operation_key, tool, arguments, trace_id=trace_id, requested_by=requested_by
        )
        return Effect.from_wire(
            await self._send(
                "POST",
                wire.EFFECTS,
                content=body,
                headers=wire.idempotency_key_header(operation_key),
            )
        )

    async def submit_many(self, items: Sequence[BatchItem]) -> list[BatchResult]:
        """``POST /v1/effects/batch``; see ``BrokerClient.submit_many``."""
        body = wire.batch_body(items)
        return wire.batch_results(
            await self._send("POST", wire.EFFECTS_BATCH, content=body)
        )

    async def get(self, effect_id: str) -> Effect:
        """``GET /v1/effects/{id}``."""
        return Effect.from_wire(await self._send("GET", wire.effect_path(effect_id)))

    async def _watch(self, effect_id: str, seconds: float, until: Until) -> Effect:
        """``GET /v1/effects/{id}/wait``; see ``BrokerClient._watch``."""
        if self._long_poll and seconds > 0:
            try:
                return Effect.from_wire(
                    await self._send(
                        "GET",
                        wire.effect_path(effect_id, wire.WAIT),
                        params=wire.wait_params(seconds, until),
                        timeout=wire.long_poll_timeout(self._http.timeout, seconds),
                    )
                )
            except RouteNotFound:
                self._long_poll = False  # an older broker: read on wait's schedule
        return await self.get(effect_id)

    async def receipt(self, effect_id: str) -> Receipt:
        """``GET /v1/effects/{id}/receipt`` (``EffectNotFound`` while there is none)."""
        return Receipt.from_wire(
            await self._send("GET", wire.effect_path(effect_id, "receipt"))
        )

    async def history(self, effect_id: str, at_sequence: int | None = None) -> History:
        """``GET /v1/effects/{id}/history[?at_sequence=N]``."""
        params = {} if at_sequence is None else {"at_sequence": at_sequence}
        return History.from_wire(
            await self._send("GET", wire.effect_path(effect_id, "history"), params=params)
        )

    async def _send(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> Any:
        resends = _Resends(self._retry, self._rand)
        resend = 0
        while True:
            try:
                response = await self._http.request(
                    method,
                    path,
                    content=content,
                    params=params,
                    headers={
                        **({"Content-Type": "application/json"} if content else {}),
                        **(headers or {}),
                    },
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
                )
            except httpx.TransportError as exc:
                wait, why = resends.after_error(method, path, resend, exc)
            else:
                step = resends.after_answer(resend, response)
                if step is None:
                    return wire.answer(response)
                wait, why = step
                await response.aclose()
            _log_resend(method, path, resend, why, wait)
            await self._sleep(wait)
            resend += 1
