"""The ``mcp`` adapter: the broker in front of an existing MCP server (issue 10, item 4).

Each attempt uses one session with the upstream server through the official MCP
client (``stdio_client`` or ``streamable_http_client`` + ``ClientSession``) and writes
exactly one ``tools/call``: a new session per attempt over HTTP; over stdio one kept
process per worker, pinged before each use and restarted when it died or lost an
answer (mcp_sessions.py). The MCP client has no resend of a request: a timeout ends
the wait and nothing is sent again (the streamable HTTP transport's only reconnection
is a GET that resumes an answer stream, never a second POST). The broker, not the
client, decides what happens next, by the one question that matters (spec "State
machine", rules 2-3): could the upstream tool have acted?

Classification, by the phase the failure happened in (each row tested in
tests/contract/test_mcp_adapter.py):

* The send gate refuses (checked before the session opens and again right before
  ``tools/call`` is written), or the attempt's time limit is spent before that ->
  ``SendRefusedError`` (retryable): nothing was sent.
* The server cannot be started or reached, or the session does not initialize within
  ``connect_timeout`` -> ``RetryableAdapterError(reason="upstream_unavailable")``:
  ``tools/call`` was never written. The tool not being listed ->
  ``TerminalAdapterError(reason="upstream_tool_missing")`` (nothing was sent, and no
  retry fixes the configuration).
* Anything after ``tools/call`` was written without an answer - the timeout, the
  connection dropping, the upstream process dying mid-call - ->
  ``OutcomeUnknownError``: the tool may have acted.
* A JSON-RPC error answer -> ``TerminalAdapterError`` if its code is in
  ``terminal_rpc_codes`` (default only -32601, "method not found"), else
  ``OutcomeUnknownError``.
* An ``isError`` result: its code (``structuredContent[error_field]``) in
  ``retryable_errors`` -> ``RetryableAdapterError`` (the upstream documents it as not
  committed), in ``unknown_errors`` -> ``OutcomeUnknownError``, in
  ``terminal_errors`` -> ``TerminalAdapterError``; any other per ``tool_error``
  (``unknown`` by default: the SDK's server answers every exception a tool raises
  this way, after a side effect too - issue 19, item 1; or ``terminal``).
* A result -> ``DispatchResult``: the structured content, else a text content that is
  one JSON object, else the content blocks; the external id at ``external_id_field``.

The lookup (reconcilable) calls ``lookup_tool`` with the key: ``found`` true ->
COMMITTED, false -> NOT_COMMITTED (as of the check; the engine weighs it against the
settlement bound), anything else, an error or no answer -> UNKNOWN.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import mcp.types as types
from mcp import ClientSession, MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from effect_broker.adapters.base import (
    DispatchRequest,
    DispatchResult,
    EffectAdapter,
    ProbeRequest,
    ProbeResult,
)
from effect_broker.adapters.mcp_answers import ReadAnswer, read_answer
from effect_broker.adapters.mcp_sessions import StdioSessions
from effect_broker.domain.canonical import parse_json_strict
from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.errors import (
    AdapterError,
    ConfigurationError,
    InvalidJsonError,
    OutcomeUnknownError,
    RetryableAdapterError,
    SendRefusedError,
    TerminalAdapterError,
)
from effect_broker.domain.states import ProbeStatus
from effect_broker.domain.upstream import AnswerReading, McpUpstream

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


class UpstreamUnavailable(Exception):
    """The upstream session could not be opened: nothing was sent to the tool."""


@asynccontextmanager
async def open_upstream(
    upstream: McpUpstream, connect_timeout: float
) -> AsyncIterator[ClientSession]:
    """An initialized client session with ``upstream``; ``UpstreamUnavailable`` when
    it cannot be started, reached or initialized within ``connect_timeout``.

    Failures of the body pass through untouched (and may come out of the transports'
    task groups inside an exception group): callers decide by what they had sent.
    """
    async with AsyncExitStack() as stack:
        try:
            if upstream.url is not None:
                headers = {}
                if upstream.bearer_token_env:
                    token = os.environ.get(upstream.bearer_token_env, "")
                    headers["Authorization"] = f"Bearer {token}"
                client = await stack.enter_async_context(
                    create_mcp_http_client(headers=headers)
                )
                read, write = await stack.enter_async_context(
                    streamable_http_client(upstream.url, http_client=client)
                )
            else:
                env = dict(upstream.env)
                env.update(
                    {k: os.environ[k] for k in upstream.inherit_env if k in os.environ}
                )
                params = StdioServerParameters(
                    command=upstream.command[0],
                    args=list(upstream.command[1:]),
                    env=env,
                    cwd=upstream.cwd,
                )
                read, write = await stack.enter_async_context(stdio_client(params))
            session = await stack.enter_async_context(ClientSession(read, write))
            # Only the handshake is timed: a scope may not span the yield below.
            with anyio.fail_after(max(0.0, connect_timeout)):
                await session.initialize()
        except Exception as exc:  # refused, not found, timed out: tools/call unsent
            raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
        yield session


async def find_tool(session: ClientSession, name: str) -> types.Tool | None:
    """The upstream's listing of ``name`` (following pages), or None."""
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever must not hang an attempt
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        listed = await session.list_tools(params=params)
        for tool in listed.tools:
            if tool.name == name:
                return tool
        cursor = listed.next_cursor
        if not cursor:
            return None
    return None


def run_async(fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
    """Run ``fn(*args)`` to completion from synchronous code, on a private event loop
    (in a thread of its own when this thread already runs one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn, *args)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, fn, *args).result()


def json_path(document: Mapping[str, Any], path: str) -> object:
    """The value at a dotted ``path`` in ``document``, or None."""
    value: object = document
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def result_document(result: types.CallToolResult) -> dict[str, Any] | None:
    """A tool result as one JSON object: its structured content, else a text block
    that is one JSON object; None when it is neither."""
    if isinstance(result.structured_content, dict):
        return dict(result.structured_content)
    texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
    if len(texts) == 1:
        try:
            document = parse_json_strict(texts[0].encode())
        except InvalidJsonError:
            return None
        if isinstance(document, dict):
            return document
    return None


class McpAdapter(EffectAdapter):
    """One ``tools/call`` per attempt on an upstream MCP server; lookup by a tool."""

    name = "mcp"

    def __init__(self, contract: EffectContract) -> None:
        super().__init__(contract)
        if contract.upstream is None:  # EffectContract refuses this; belt and braces
            raise ConfigurationError(
                'adapter = "mcp" needs [contract.upstream]', contract=contract.name
            )
        self.upstream: McpUpstream = contract.upstream
        # A stdio server is kept between attempts and lookups, one process per
        # worker, restarted when it dies (mcp_sessions.py; issue 22, item 4).
        self._sessions = (
            StdioSessions(self.upstream) if self.upstream.url is None else None
        )

    def close(self) -> None:
        """Stop the kept stdio server, if any."""
        if self._sessions is not None:
            self._sessions.close()

    def warm_up(self) -> None:
        """Start (or ping) the kept stdio server now, outside any attempt; nothing is
        sent to the tool. ``RetryableAdapterError`` (``upstream_unavailable``) when it
        does not start and initialize within ``connect_timeout``; over HTTP a no-op
        (each attempt opens its own session)."""
        # For the conformance kit (issue 22, item 1): an attempt's limit then times
        # the call it is about, not a Python server's start, which takes seconds on
        # a loaded host and used to spend a short limit before tools/call was written.
        sessions = self._sessions
        if sessions is None:
            return
        connect = self.upstream.connect_timeout.total_seconds()

        async def started() -> None:
            async with sessions.session(connect):
                pass

        try:
            sessions.run(started)
        except UpstreamUnavailable as exc:
            raise RetryableAdapterError(
                f"the upstream MCP server could not be started ({exc})",
                adapter=self.name,
                reason="upstream_unavailable",
            ) from exc

    def _run(self, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        if self._sessions is not None:
            return self._sessions.run(lambda: fn(*args))
        return run_async(fn, *args)

    def _open(self, connect_timeout: float) -> AbstractAsyncContextManager[ClientSession]:
        if self._sessions is not None:
            return self._sessions.session(connect_timeout)
        return open_upstream(self.upstream, connect_timeout)

    # --- dispatch ----------------------------------------------------------------

    def _send(self, request: DispatchRequest) -> DispatchResult:
        """One session, one ``tools/call``; classify by phase (module table)."""
        arguments = dict(request.arguments)
        if self.upstream.key_argument:
            # The same downstream key on every attempt: the upstream dedups (or
            # records) on it, so a resend after a lost answer is not a second effect.
            arguments[self.upstream.key_argument] = request.downstream_key
        started = time.monotonic()
        limit = request.gate.remaining()
        if limit <= 0:
            raise SendRefusedError(
                "the attempt's time limit was spent before anything was sent",
                adapter=self.name,
            )
        result = self._run(self._call, request, arguments, started, limit)
        return self._classify(request, result)

    async def _call(
        self,
        request: DispatchRequest,
        arguments: dict[str, Any],
        started: float,
        limit: float,
    ) -> types.CallToolResult:
        upstream = self.upstream

        def left() -> float:
            return limit - (time.monotonic() - started)

        # Decided inside the session and raised only after it closed: an error raised
        # inside would leave through the transports' task groups, wrapped.
        outcome: types.CallToolResult | AdapterError | None = None
        sent = False
        try:
            connect = min(upstream.connect_timeout.total_seconds(), left())
            async with self._open(connect) as session:
                try:
                    with anyio.fail_after(max(0.0, left())):
                        tool = await find_tool(session, upstream.tool)
                except Exception as exc:
                    raise UpstreamUnavailable(
                        f"tools/list: {type(exc).__name__}"
                    ) from exc
                wait = min(upstream.timeout.total_seconds(), left())
                if tool is None:
                    outcome = TerminalAdapterError(
                        f"the upstream server lists no tool {upstream.tool!r}",
                        adapter=self.name,
                        reason="upstream_tool_missing",
                    )
                elif wait <= 0:
                    outcome = SendRefusedError(
                        "the attempt's time limit was spent before tools/call was sent",
                        adapter=self.name,
                    )
                else:
                    # A worker paused since the session opened must not send now
                    # (issue 9, defect 1): the last check before the one request.
                    try:
                        request.gate.check()
                    except SendRefusedError as exc:
                        outcome = exc
                    else:
                        sent = True
                        outcome = await self._write_once(
                            session, request, arguments, wait
                        )
        except Exception as exc:  # also exception groups from the transports
            if outcome is None:
                outcome = self._failed(request, exc, sent=sent)
            # else: the answer (or the decision) came before the teardown failed.
        if self._sessions is not None and isinstance(outcome, OutcomeUnknownError):
            # A process that lost an answer is not trusted with the next call.
            await self._sessions.discard()
        if isinstance(outcome, AdapterError):
            raise outcome
        if outcome is None:  # pragma: no cover - every path above sets it
            raise OutcomeUnknownError("no outcome recorded", adapter=self.name)
        return outcome

    def _failed(
        self, request: DispatchRequest, exc: Exception, *, sent: bool
    ) -> AdapterError:
        if sent:
            self._log(request, "no_answer")
            error: AdapterError = OutcomeUnknownError(
                f"{type(exc).__name__} after tools/call was sent; the outcome is unknown",
                adapter=self.name,
                reason=type(exc).__name__,
            )
        else:
            self._log(request, "upstream_unavailable")
            error = RetryableAdapterError(
                f"the upstream MCP server could not be reached ({exc}); tools/call was "
                "never sent",
                adapter=self.name,
                reason="upstream_unavailable",
            )
        error.__cause__ = exc
        return error

    async def _write_once(
        self,
        session: ClientSession,
        request: DispatchRequest,
        arguments: dict[str, Any],
        wait: float,
    ) -> types.CallToolResult | AdapterError:
        try:
            # read_timeout ends the wait; the client never resends the request.
            answer = await session.call_tool(
                self.upstream.tool, arguments, read_timeout_seconds=wait
            )
        except MCPError as exc:
            code = exc.error.code
            if code in self.upstream.terminal_rpc_codes:
                self._log(request, "rpc_refused")
                return TerminalAdapterError(
                    f"the upstream refused tools/call (JSON-RPC {code})",
                    adapter=self.name,
                    rpc_code=code,
                )
            self._log(request, "no_answer")
            return OutcomeUnknownError(
                f"JSON-RPC error {code} after tools/call was sent; outcome unknown",
                adapter=self.name,
                rpc_code=code,
            )
        except Exception as exc:  # dropped, crashed, timed out: it may have acted
            return self._failed(request, exc, sent=True)
        if not isinstance(answer, types.CallToolResult):
            return OutcomeUnknownError(
                f"tools/call answered {type(answer).__name__}; outcome unknown",
                adapter=self.name,
            )
        return answer

    def _classify(
        self, request: DispatchRequest, result: types.CallToolResult
    ) -> DispatchResult:
        upstream = self.upstream
        if upstream.answer is not None:
            read = read_answer(result, upstream.answer, upstream.external_id_field)
            decided = self._by_reading(request, result, read)
            if decided is not None:
                return decided
        document = result_document(result)
        if result.is_error:
            code = document.get(upstream.error_field) if document else None
            code = code if isinstance(code, str) else None
            self._log(request, f"tool_error:{code}")
            details = {"adapter": self.name, "upstream_error": code}
            if code in upstream.retryable_errors:
                raise RetryableAdapterError(
                    f"the upstream tool answered {code!r}, documented as not committed",
                    **details,
                )
            if code in upstream.unknown_errors or (
                code not in upstream.terminal_errors and upstream.tool_error == "unknown"
            ):
                raise OutcomeUnknownError(
                    f"the upstream tool answered {code or 'an error'!r}; it may have "
                    "acted, the outcome is unknown",
                    **details,
                )
            raise TerminalAdapterError(
                f"the upstream tool refused the call ({code or 'isError'})", **details
            )
        self._log(request, "answered")
        if document is None:
            document = {
                "content": [
                    c.model_dump(mode="json", by_alias=True, exclude_none=True)
                    for c in result.content
                ]
            }
        external = json_path(document, upstream.external_id_field)
        external_id = (
            str(external)
            if isinstance(external, str | int) and not isinstance(external, bool)
            else None
        )
        return DispatchResult(external_id=external_id, output=document)

    def _by_reading(
        self, request: DispatchRequest, result: types.CallToolResult, read: ReadAnswer
    ) -> DispatchResult | None:
        """Decide by ``[contract.upstream.answer]``; None: the code lists decide (an
        ``isError`` answer whose value means nothing listed)."""
        details: dict[str, object] = {"adapter": self.name, "upstream_answer": read.value}
        if read.meaning in ("committed", "already_done") or (
            read.meaning == "other" and not result.is_error
        ):
            self._log(request, f"answer:{read.meaning}")
            output: dict[str, object] = dict(read.evidence)
            if read.meaning == "already_done":
                # The key already took effect: the earlier attempt committed. The
                # answer is the evidence, kept with the receipt.
                output["already_done"] = read.value
            document = read.evidence.get("document")
            if isinstance(document, dict) and read.meaning != "already_done":
                output = dict(document)
            return DispatchResult(external_id=read.external_id, output=output)
        if read.meaning == "not_committed":
            self._log(request, "answer:not_committed")
            raise RetryableAdapterError(
                f"the upstream answered {read.value!r}, documented as not committed",
                **details,
            )
        if read.meaning == "failed":
            self._log(request, "answer:failed")
            raise TerminalAdapterError(
                f"the upstream recorded the call as failed ({read.value!r})",
                external_id=read.external_id,
                **details,
            )
        if read.meaning == "unread" and not result.is_error:
            self._log(request, "answer:unread")
            raise OutcomeUnknownError(
                "the upstream's answer does not carry the value "
                "[contract.upstream.answer] reads; the outcome is unknown",
                **details,
            )
        return None

    # --- lookup ------------------------------------------------------------------

    def _lookup(self, request: ProbeRequest) -> ProbeResult:
        """Call ``lookup_tool`` with the key: found -> COMMITTED, not -> NOT_COMMITTED."""
        upstream = self.upstream
        if upstream.lookup_tool is None:
            return ProbeResult(
                status=ProbeStatus.UNKNOWN, evidence={"reason": "no lookup"}
            )
        if upstream.lookup_by == "downstream_key":
            key: object = request.downstream_key
        else:
            key = request.arguments.get(upstream.lookup_by)
        if not isinstance(key, str | int) or isinstance(key, bool):
            return ProbeResult(
                status=ProbeStatus.UNKNOWN,
                evidence={"reason": f"argument {upstream.lookup_by!r} is not a key"},
            )
        checked_at = datetime.now(UTC)
        result = self._run(self._lookup_call, {upstream.lookup_key_argument: key})
        evidence: dict[str, object] = {"checked_at": checked_at.isoformat()}
        if upstream.lookup_answer is not None:
            return self._lookup_by_reading(result, upstream.lookup_answer, evidence)
        document = result_document(result)
        if result.is_error or document is None:
            evidence["upstream_error"] = (
                document.get(upstream.error_field) if document else "unreadable"
            )
            return ProbeResult(status=ProbeStatus.UNKNOWN, evidence=evidence)
        found = document.get(upstream.found_field)
        if found is False:
            return ProbeResult(status=ProbeStatus.NOT_COMMITTED, evidence=evidence)
        if found is not True:
            evidence["reason"] = f"no boolean {upstream.found_field!r} in the answer"
            return ProbeResult(status=ProbeStatus.UNKNOWN, evidence=evidence)
        external = json_path(document, upstream.external_id_field)
        return ProbeResult(
            status=ProbeStatus.COMMITTED,
            external_id=str(external) if isinstance(external, str | int) else None,
            output=document,
            evidence=evidence,
        )

    def _lookup_by_reading(
        self,
        result: types.CallToolResult,
        reading: AnswerReading,
        evidence: dict[str, object],
    ) -> ProbeResult:
        read = read_answer(result, reading, self.upstream.external_id_field)
        evidence.update(read.evidence)
        evidence["read"] = read.value
        if read.meaning == "committed":
            document = read.evidence.get("document")
            return ProbeResult(
                status=ProbeStatus.COMMITTED,
                external_id=read.external_id,
                output=dict(document) if isinstance(document, dict) else read.evidence,
                evidence=evidence,
            )
        if read.meaning == "not_committed":
            return ProbeResult(status=ProbeStatus.NOT_COMMITTED, evidence=evidence)
        evidence["reason"] = "the lookup's answer proves neither way"
        return ProbeResult(status=ProbeStatus.UNKNOWN, evidence=evidence)

    async def _lookup_call(self, arguments: dict[str, Any]) -> types.CallToolResult:
        upstream = self.upstream
        assert upstream.lookup_tool is not None
        timeout = upstream.timeout.total_seconds()
        # Any failure raises, and the base class turns it into UNKNOWN.
        async with self._open(upstream.connect_timeout.total_seconds()) as s:
            return await s.call_tool(
                upstream.lookup_tool, arguments, read_timeout_seconds=timeout
            )

    def _log(self, request: DispatchRequest, outcome: str) -> None:
        # Never arguments, output or the key (STYLE rule 8).
        logger.info(
            "mcp dispatch %s",
            outcome,
            extra={
                "action": "mcp_dispatch",
                "effect_id": request.effect.effect_id,
                "attempt_id": request.attempt_id,
                "outcome": outcome,
                "upstream_tool": self.upstream.tool,
            },
        )


__all__ = ["McpAdapter", "UpstreamUnavailable", "open_upstream", "run_async"]
