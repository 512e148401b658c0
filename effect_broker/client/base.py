"""The protocol every client shares: ``wait``, ``perform`` and the ``effect``
decorator, written once on top of four primitives a client implements (``submit``,
``get``, ``receipt``, ``history``) - the way the adapter base class holds the dispatch
protocol over ``_send``/``_lookup``.

The sync base serves ``BrokerClient`` (HTTP) and ``InProcessClient`` (services); the
async base serves ``AsyncBrokerClient``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ParamSpec

from effect_broker.client import waiting
from effect_broker.client.models import Effect, History, Receipt
from effect_broker.client.waiting import OnUnknown, UntilName
from effect_broker.domain.waits import Until, until_of

P = ParamSpec("P")

#: How long ``wait``, ``perform`` and the decorator wait by default, in seconds.
DEFAULT_WAIT = 30.0


class SyncBrokerOps(ABC):
    """``wait``/``perform``/``effect`` over a client's ``submit``/``get``/``receipt``."""

    _sleep: Callable[[float], None] = staticmethod(time.sleep)
    _monotonic: Callable[[], float] = staticmethod(time.monotonic)

    @abstractmethod
    def submit(
        self,
        operation_key: str,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        trace_id: str | None = None,
        requested_by: str = "",
    ) -> Effect:
        """Reserve an effect, or replay the one this operation key already names."""

    @abstractmethod
    def get(self, effect_id: str) -> Effect:
        """Read one effect of this tenant."""

    @abstractmethod
    def receipt(self, effect_id: str) -> Receipt:
        """The receipt of a succeeded effect (``EffectNotFound`` while none)."""

    @abstractmethod
    def history(self, effect_id: str, at_sequence: int | None = None) -> History:
        """The effect folded from its verified events (up to ``at_sequence``)."""

    def wait(
        self,
        effect_id: str,
        timeout: float = DEFAULT_WAIT,
        *,
        until: UntilName | Until = "answer",
    ) -> Effect:
        """Wait until the effect settles and return it, whatever its outcome
        (succeeded, failed_final or compensated: ``perform`` is what raises for a
        failure).

        ``until="answer"`` (the default): raises ``OutcomeUnknown`` as soon as only an
        operator can settle the effect (an unsafe ``outcome_unknown``,
        ``manual_review``). ``until="settled"``: waits through those until an
        operator resolves the effect, for a workflow that would rather pause than
        fail. Either way, ``OutcomeUnknown`` when ``timeout`` runs out while nobody
        knows yet whether the effect happened (reconciling, or no operator yet),
        ``WaitTimeout`` when it runs out while the effect is still in progress; an
        unknown outcome is never turned into a result or a failure.

        The HTTP clients wait on the broker's long-poll (``GET
        /v1/effects/{id}/wait``): woken by the change itself, one request per
        ``MAX_WAIT_SECONDS`` at most while nothing happens.
        """
        rule = until_of(until)
        deadline = self._monotonic() + timeout
        pauses = waiting.poll_intervals()
        while True:
            asked = self._monotonic()
            effect = self._watch(effect_id, deadline - asked, rule)
            if waiting.check(effect, rule) is not None:
                return effect
            now = self._monotonic()
            left = deadline - now
            if left <= 0:
                raise waiting.timed_out(effect, timeout)
            # A long-poll already waited; a plain read (or a broker that answered at
            # once) did not, and reads again only after the schedule's pause.
            rest = waiting.next_pause(pauses, effect) - (now - asked)
            if rest > 0:
                self._sleep(min(rest, left))

    def _watch(self, effect_id: str, seconds: float, until: Until) -> Effect:
        """The effect after waiting at most ``seconds`` for a state ``until`` stops at.
        This default reads at once (``wait`` then pauses); a client that can be woken
        by the broker overrides it."""
        return self.get(effect_id)

    def perform(
        self,
        operation_key: str,
        *positional: object,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_WAIT,
        trace_id: str | None = None,
        requested_by: str = "",
        on_unknown: OnUnknown = "raise",
    ) -> dict[str, Any]:
        """Submit, wait, and return the receipt's result:
        ``perform(operation_key, tool=..., arguments=...)``.

        The operation key comes first, as in ``submit``; the rest is by keyword, so
        the old ``perform(tool, operation_key, arguments)`` order is a ``TypeError``
        that says so instead of a submit of the wrong tool (issue 23).

        Raises ``OutcomeUnknown`` (never a result, never ``EffectFailed``) when nobody
        knows whether the effect happened, ``EffectFailed`` when it ended
        ``failed_final`` (its message says whether that is proof it did not happen).
        ``on_unknown="wait"`` waits (``wait(until="settled")``, up to ``timeout``) for
        an operator to settle an effect only they can settle, and then returns the
        result or raises the final failure; ``"raise"`` (the default) raises
        ``OutcomeUnknown`` at once.
        """
        tool, arguments = _keywords_only(positional, tool, arguments)
        until = waiting.on_unknown_until(on_unknown)
        submitted = self.submit(
            operation_key, tool, arguments, trace_id=trace_id, requested_by=requested_by
        )
        effect = (
            submitted
            if submitted.settled
            else self.wait(submitted.effect_id, timeout, until=until)
        )
        waiting.result_of(effect)
        return dict(self.receipt(effect.effect_id).result)

    def effect(
        self,
        *,
        tool: str,
        key: Callable[..., str],
        arguments: Callable[..., Mapping[str, Any]] | None = None,
        timeout: float = DEFAULT_WAIT,
        on_unknown: OnUnknown = "raise",
    ) -> Callable[[Callable[P, Any]], Callable[P, dict[str, Any]]]:
        """Decorate a function so that calling it performs ``tool`` through the broker.

        The function's arguments, by name and with defaults applied, are the tool's
        arguments (or ``arguments(**those)`` when given); ``key(**those)`` is the
        operation key. The body is never run: the broker's worker performs the effect,
        and the call returns the receipt's result or raises (``OutcomeUnknown``,
        ``EffectFailed``, ``PayloadConflict``, ...); ``timeout`` and ``on_unknown``
        are ``perform``'s::

            @broker.effect(
                tool="charge_card", key=lambda order, **_: f"order:{order}:charge:v1"
            )
            def charge_card(order: str, amount_minor: int, currency: str) -> dict: ...
        """

        def decorate(func: Callable[P, Any]) -> Callable[P, dict[str, Any]]:
            if inspect.iscoroutinefunction(func):
                raise TypeError(
                    f"{func.__qualname__} is async: decorate it with an "
                    "AsyncBrokerClient's effect()"
                )
            named = _named_arguments(func)
            waiting.on_unknown_until(on_unknown)  # a bad value fails here, not per call

            @functools.wraps(func)
            def call(*args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
                values = named(args, kwargs)
                return self.perform(
                    key(**values),
                    tool=tool,
                    arguments=arguments(**values) if arguments else values,
                    timeout=timeout,
                    on_unknown=on_unknown,
                )

            return call

        return decorate


class AsyncBrokerOps(ABC):
    """The async twin of ``SyncBrokerOps``."""

    _sleep: Callable[[float], Awaitable[None]] = staticmethod(asyncio.sleep)
    _monotonic: Callable[[], float] = staticmethod(time.monotonic)

    @abstractmethod
    async def submit(
        self,
        operation_key: str,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        trace_id: str | None = None,
        requested_by: str = "",
    ) -> Effect:
        """Reserve an effect, or replay the one this operation key already names."""

    @abstractmethod
    async def get(self, effect_id: str) -> Effect:
        """Read one effect of this tenant."""

    @abstractmethod
    async def receipt(self, effect_id: str) -> Receipt:
        """The receipt of a succeeded effect (``EffectNotFound`` while none)."""

    @abstractmethod
    async def history(self, effect_id: str, at_sequence: int | None = None) -> History:
        """The effect folded from its verified events (up to ``at_sequence``)."""

    async def wait(
        self,
        effect_id: str,
        timeout: float = DEFAULT_WAIT,
        *,
        until: UntilName | Until = "answer",
    ) -> Effect:
        """Wait until the effect settles; see ``SyncBrokerOps.wait``."""
        rule = until_of(until)
        deadline = self._monotonic() + timeout
        pauses = waiting.poll_intervals()
        while True:
            asked = self._monotonic()
            effect = await self._watch(effect_id, deadline - asked, rule)
            if waiting.check(effect, rule) is not None:
                return effect
            now = self._monotonic()
            left = deadline - now
            if left <= 0:
                raise waiting.timed_out(effect, timeout)
            rest = waiting.next_pause(pauses, effect) - (now - asked)
            if rest > 0:
                await self._sleep(min(rest, left))

    async def _watch(self, effect_id: str, seconds: float, until: Until) -> Effect:
        """See ``SyncBrokerOps._watch``."""
        return await self.get(effect_id)

    async def perform(
        self,
        operation_key: str,
        *positional: object,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_WAIT,
        trace_id: str | None = None,
        requested_by: str = "",
        on_unknown: OnUnknown = "raise",
    ) -> dict[str, Any]:
        """Submit, wait, return the receipt's result; see ``SyncBrokerOps.perform``."""
        tool, arguments = _keywords_only(positional, tool, arguments)
        until = waiting.on_unknown_until(on_unknown)
        submitted = await self.submit(
            operation_key, tool, arguments, trace_id=trace_id, requested_by=requested_by
        )
        effect = (
            submitted
            if submitted.settled
            else await self.wait(submitted.effect_id, timeout, until=until)
        )
        waiting.result_of(effect)
        return dict((await self.receipt(effect.effect_id)).result)

    def effect(
        self,
        *,
        tool: str,
        key: Callable[..., str],
        arguments: Callable[..., Mapping[str, Any]] | None = None,
        timeout: float = DEFAULT_WAIT,
        on_unknown: OnUnknown = "raise",
    ) -> Callable[[Callable[P, Awaitable[Any]]], Callable[P, Awaitable[dict[str, Any]]]]:
        """Decorate an ``async def`` so that awaiting it performs ``tool`` through the
        broker; see ``SyncBrokerOps.effect``."""

        def decorate(
            func: Callable[P, Awaitable[Any]],
        ) -> Callable[P, Awaitable[dict[str, Any]]]:
            if not inspect.iscoroutinefunction(func):
                raise TypeError(
                    f"{func.__qualname__} is not async: decorate it with a "
                    "BrokerClient's effect()"
                )
            named = _named_arguments(func)
            waiting.on_unknown_until(on_unknown)  # a bad value fails here, not per call

            @functools.wraps(func)
            async def call(*args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
                values = named(args, kwargs)
                return await self.perform(
                    key(**values),
                    tool=tool,
                    arguments=arguments(**values) if arguments else values,
                    timeout=timeout,
                    on_unknown=on_unknown,
                )

            return call

        return decorate


def _keywords_only(
    positional: tuple[object, ...],
    tool: str | None,
    arguments: Mapping[str, Any] | None,
) -> tuple[str, Mapping[str, Any]]:
    """``perform``'s tool and arguments, or a TypeError that shows the call to write."""
    if positional or tool is None or arguments is None:
        raise TypeError(
            "perform() takes the operation key first and the rest by keyword: "
            "perform(operation_key, tool=..., arguments=...) - the same order as "
            "submit(operation_key, tool, arguments); perform(tool, operation_key, "
            "arguments) is no longer accepted"
        )
    return tool, arguments


def _named_arguments(
    func: Callable[..., Any],
) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """A binder from a call's ``(args, kwargs)`` to ``{name: value}`` with defaults
    applied. ``*args`` has no names to become JSON members, so it is refused here, at
    decoration; ``**kwargs`` is merged in."""
    signature = inspect.signature(func)
    kinds = {p.kind for p in signature.parameters.values()}
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        raise TypeError(
            f"{func.__qualname__} takes *args; a broker tool's arguments need names"
        )
    extra = [
        p.name
        for p in signature.parameters.values()
        if p.kind is inspect.Parameter.VAR_KEYWORD
    ]

    def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        for name in extra:
            values.update(values.pop(name, {}))
        return values

    return bind
