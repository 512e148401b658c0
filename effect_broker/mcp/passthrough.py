"""Pass-through tools: upstream MCP tools the broker's server lists and forwards
directly, with no ledger (issue 10, items 3-4: "read-only tools may be configured as
pass-through"; strict mode).

A ``[[passthrough]]`` table names an upstream server and tool and says whether the tool
is read-only. What is listed depends on strict mode (default on,
``EFFECT_BROKER_MCP_STRICT`` / ``effect-broker mcp --no-strict``):

* strict: a pass-through is listed and forwarded only when it is declared
  ``read_only = true`` AND the upstream's own listing marks it ``readOnlyHint: true``.
  Anything else would forward a possibly mutating call with no versioned contract, so
  it is neither listed nor forwarded (a call gets a tool error saying why).
* not strict: every pass-through is listed and forwarded; one that is not verified
  read-only says in its description that the broker records nothing and gives no
  guarantee, and its annotations claim nothing (destructive, not idempotent).

The upstream's listing (schema, annotations) is read when the broker's tools are
listed, kept for ``CACHE_SECONDS``, and read again when a call finds none. A call is
one ``tools/call`` on a fresh session; the upstream's answer is returned as it is.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import anyio
import mcp.types as types

from effect_broker.adapters.mcp_adapter import find_tool, open_upstream
from effect_broker.domain.contracts import ContractRegistry
from effect_broker.domain.upstream import PassThroughTool

logger = logging.getLogger(__name__)

#: How long an upstream's listing of a pass-through tool is trusted.
CACHE_SECONDS = 30.0

NO_GUARANTEE = (
    "WARNING: pass-through with no contract (strict mode is off). effect-broker "
    "forwards this call as it is and records nothing: no operation key, no "
    "deduplication, no receipt, no guarantee. A retry may do it again."
)
_UNVERIFIED = types.ToolAnnotations(
    read_only_hint=False,
    destructive_hint=True,
    idempotent_hint=False,
    open_world_hint=True,
)


@dataclass(frozen=True)
class Verdict:
    """Whether a pass-through may be listed and forwarded, and what to tell the agent."""

    allowed: bool
    read_only: bool
    reason: str = ""


def judge(config: PassThroughTool, listed: types.Tool, *, strict: bool) -> Verdict:
    """Strict mode's rule for one pass-through (module docstring)."""
    hinted = bool(listed.annotations and listed.annotations.read_only_hint is True)
    if config.read_only and hinted:
        return Verdict(allowed=True, read_only=True)
    if not config.read_only:
        why = "it is declared read_only = false (it may change something)"
    else:
        why = "the upstream does not mark it readOnlyHint: true"
    return Verdict(allowed=not strict, read_only=False, reason=why)


class PassThroughMirror:
    """The pass-through tools of one MCP server, under one strict setting."""

    def __init__(self, *, strict: bool) -> None:
        self.strict = strict
        self._listed: dict[str, tuple[float, types.Tool]] = {}

    def find(self, registry: ContractRegistry, name: str) -> PassThroughTool | None:
        """The pass-through called ``name``, if the contracts file declares one."""
        return next((p for p in registry.passthroughs if p.tool == name), None)

    async def _upstream_tool(
        self, config: PassThroughTool, *, fresh: bool = False
    ) -> types.Tool | None:
        cached = self._listed.get(config.tool)
        if (
            cached is not None
            and not fresh
            and time.monotonic() - cached[0] < CACHE_SECONDS
        ):
            return cached[1]
        upstream = config.upstream
        try:
            async with open_upstream(
                upstream, upstream.connect_timeout.total_seconds()
            ) as s:
                tool = await find_tool(s, upstream.tool)
        except Exception as exc:  # an unreachable upstream lists nothing
            logger.warning(
                "pass-through upstream unavailable",
                extra={
                    "action": "mcp_passthrough_list",
                    "tool": config.tool,
                    "error": type(exc).__name__,
                },
            )
            return None
        if tool is not None:
            self._listed[config.tool] = (time.monotonic(), tool)
        return tool

    async def list_tools(
        self, registry: ContractRegistry, taken: set[str]
    ) -> list[types.Tool]:
        """The pass-through tools to list (names in ``taken`` are never shadowed)."""
        configs = [c for c in registry.passthroughs if c.tool not in taken]
        found: dict[str, types.Tool | None] = {}

        async def read(config: PassThroughTool) -> None:
            found[config.tool] = await self._upstream_tool(config)

        # Each upstream is asked at once: a stdio server takes a process start.
        async with anyio.create_task_group() as group:
            for config in configs:
                group.start_soon(read, config)
        listed = []
        for config in configs:
            upstream_tool = found.get(config.tool)
            if upstream_tool is None:
                continue
            verdict = judge(config, upstream_tool, strict=self.strict)
            if verdict.allowed:
                listed.append(self._face(config, upstream_tool, verdict))
        return listed

    def _face(
        self, config: PassThroughTool, upstream_tool: types.Tool, verdict: Verdict
    ) -> types.Tool:
        text = config.description or upstream_tool.description or config.tool
        if verdict.read_only:
            description = (
                f"{text}\n\nRead-only pass-through to an upstream MCP server: "
                "effect-broker forwards it directly and records nothing."
            )
            annotations = upstream_tool.annotations
        else:
            description = f"{NO_GUARANTEE}\n\n{text}"
            annotations = _UNVERIFIED
        return types.Tool(
            name=config.tool,
            description=description,
            input_schema=upstream_tool.input_schema,
            output_schema=upstream_tool.output_schema,
            annotations=annotations,
        )

    async def call(
        self, config: PassThroughTool, arguments: dict[str, object]
    ) -> types.CallToolResult:
        """Forward one call if strict mode allows it; the upstream's answer as it is."""
        upstream_tool = await self._upstream_tool(config) or await self._upstream_tool(
            config, fresh=True
        )
        if upstream_tool is None:
            return _error(
                "upstream_unavailable",
                f"The upstream server of {config.tool!r} cannot be reached or does not "
                "list the tool; nothing was forwarded.",
            )
        verdict = judge(config, upstream_tool, strict=self.strict)
        if not verdict.allowed:
            return _error(
                "unknown_tool",
                f"There is no tool {config.tool!r}: strict mode forwards a pass-through "
                f"only when it is read-only, and {verdict.reason}. A side-effecting tool "
                "needs a versioned contract. Nothing was forwarded.",
            )
        upstream = config.upstream
        answer: types.CallToolResult | None = None
        sent = False
        try:
            async with open_upstream(
                upstream, upstream.connect_timeout.total_seconds()
            ) as s:
                sent = True
                result = await s.call_tool(
                    upstream.tool,
                    arguments,
                    read_timeout_seconds=upstream.timeout.total_seconds(),
                )
                if isinstance(result, types.CallToolResult):
                    answer = result
        except Exception as exc:  # also exception groups from the transports
            if answer is None:
                logger.info(
                    "pass-through call without answer",
                    extra={
                        "action": "mcp_passthrough_call",
                        "tool": config.tool,
                        "error": type(exc).__name__,
                    },
                )
                if not sent:
                    return _error(
                        "upstream_unavailable",
                        f"The upstream server of {config.tool!r} cannot be reached; "
                        "nothing was forwarded.",
                    )
                unknown = "" if verdict.read_only else " It may have acted."
                return _error(
                    "no_answer",
                    f"The upstream server of {config.tool!r} did not answer.{unknown}",
                )
        if answer is None:
            return _error(
                "no_answer", f"The upstream tool {config.tool!r} gave no result."
            )
        return answer


def _error(code: str, message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"[{code}] {message}")],
        structured_content={"code": code, "message": message, "details": {}},
        is_error=True,
    )


__all__ = ["CACHE_SECONDS", "NO_GUARANTEE", "PassThroughMirror", "Verdict", "judge"]
