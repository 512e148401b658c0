"""An upstream MCP server in a contracts file: ``[contract.upstream]`` and
``[[passthrough]]`` (issue 10, item 4: the broker in front of an existing MCP server).

Pure parsing, no I/O: a table becomes an ``McpUpstream`` (where the server is, which
tool, how its answers are read) or a ``PassThroughTool``. Every problem is a
``ValueError("<field>: <reason>")`` that ``contracts.py`` re-raises as a
``ContractError`` naming the file, the contract and the field.

What the safety class may claim is decided in ``contracts.py`` (``EffectContract``):
an upstream tool is unsafe unless the contract names the argument that carries the
downstream key (idempotent), or a lookup tool and a settlement bound (reconcilable).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

from effect_broker.domain import contract_fields

#: ``tool_error`` values: how an upstream ``isError`` result is classified by default.
TOOL_ERROR_CLASSES = ("terminal", "unknown")
#: The default ``tool_error``: an ``isError`` result with no documented code is the MCP
#: equivalent of an HTTP 500 (issue 19, item 1). The official SDK's server turns EVERY
#: exception a tool raises into one, including a tool that charged and then failed
#: (a timeout on a follow-up call, a failed receipt write): calling it a refusal would
#: end a charged effect ``failed_final``. ``terminal`` stays available for an upstream
#: that only reports errors before acting, at that risk; a documented refusal belongs
#: in ``terminal_errors``.
DEFAULT_TOOL_ERROR = "unknown"
#: ``command = "{python}"``: the Python interpreter running the broker.
THIS_PYTHON = "{python}"
#: JSON-RPC "method not found": the server has no such method, so nothing ran.
METHOD_NOT_FOUND = -32601
#: Codes the MCP client raises itself (connection closed, request timeout).
CLIENT_MADE_CODES = (-32000, -32001)

# The allowed keys come from the one definition of the fields (``contract_fields``).
_UPSTREAM_FIELDS = contract_fields.names(contract_fields.UPSTREAM)
_PASSTHROUGH_FIELDS = contract_fields.names(contract_fields.PASSTHROUGH)
_ANSWER_FIELDS = contract_fields.names(contract_fields.ANSWER)


@dataclass(frozen=True, slots=True)
class AnswerReading:
    """How to read an upstream tool's answer (issue 22, item 2): one value, found by a
    JSON pointer (into the structured content, else a text block that is JSON) or by
    a regular expression over the text content (its ``status`` group, else the whole
    match), and what that value proves.

    Calls: ``already_done`` and ``committed`` -> committed (a value that proves the
    key already took effect, "already exists" when the key is a name, is a commit
    found again, with the answer kept as evidence); ``not_committed`` -> retryable;
    ``failed`` -> a committed failure (terminal), like the HTTP adapter's
    ``failed_status_values``; any other value of a non-error answer -> committed; no
    value at all -> unknown. Lookups: ``committed`` -> COMMITTED, ``not_committed`` ->
    NOT_COMMITTED, anything else -> UNKNOWN (a lookup must prove both ways).
    """

    pointer: str | None = None
    pattern: str | None = None
    #: Where the external id is: a JSON pointer (pointer mode; default: the
    #: upstream's ``external_id_field``), or in pattern mode a regular expression
    #: over the text (its ``id`` group, else its first group, else the match).
    id_pointer: str | None = None
    id_pattern: str | None = None
    committed: tuple[str, ...] = ()
    not_committed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    already_done: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class McpUpstream:
    """Where an upstream MCP server is (a stdio command or a streamable HTTP URL),
    which of its tools the contract calls, and how its answers are read."""

    tool: str
    #: stdio: the executable and its arguments (``command`` + ``args``).
    command: tuple[str, ...] = ()
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Names of this process's environment variables handed to the stdio server
    #: (secrets stay out of the contracts file).
    inherit_env: tuple[str, ...] = ()
    #: streamable HTTP: the MCP endpoint.
    url: str | None = None
    #: The environment variable holding a bearer token for ``url``.
    bearer_token_env: str | None = None
    #: The tool argument the broker fills with the downstream key on every attempt.
    key_argument: str | None = None
    lookup_tool: str | None = None
    #: The lookup tool's argument that receives the key.
    lookup_argument: str | None = None
    #: "downstream_key" (default) or the name of a call argument (a business key).
    lookup_by: str = "downstream_key"
    found_field: str = "found"
    external_id_field: str = "id"
    error_field: str = "error"
    tool_error: str = DEFAULT_TOOL_ERROR
    retryable_errors: tuple[str, ...] = ()
    unknown_errors: tuple[str, ...] = ()
    terminal_errors: tuple[str, ...] = ()
    terminal_rpc_codes: tuple[int, ...] = (METHOD_NOT_FOUND,)
    connect_timeout: timedelta = timedelta(seconds=10)
    timeout: timedelta = timedelta(seconds=10)
    #: How to read a call's answer (``[contract.upstream.answer]``), if not by the
    #: error code lists alone.
    answer: AnswerReading | None = None
    #: How to read the lookup tool's answer (``[contract.upstream.lookup_answer]``),
    #: instead of a boolean ``found_field``.
    lookup_answer: AnswerReading | None = None

    @property
    def where(self) -> str:
        """The server as a short label for logs and errors (never a token)."""
        return self.url or " ".join(self.command[:3])

    @property
    def lookup_key_argument(self) -> str:
        """The lookup tool's argument name (default: the key argument, else lookup_by)."""
        return self.lookup_argument or self.key_argument or self.lookup_by


@dataclass(frozen=True, slots=True)
class PassThroughTool:
    """An upstream tool the broker's MCP server lists and forwards directly, with no
    ledger: only a read-only tool, or any tool with strict mode off (with a warning)."""

    tool: str
    upstream: McpUpstream
    read_only: bool
    description: str = ""


def _text(raw: Mapping[str, Any], key: str, where: str, default: Any = None) -> Any:
    value = raw.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ValueError(f"{where}.{key}: must be a non-empty string")
    return value


def _texts(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(
        isinstance(item, str) and item for item in value
    ):
        raise ValueError(f"{where}.{key}: must be a list of non-empty strings")
    return tuple(value)


def _duration(raw: Mapping[str, Any], key: str, where: str, default: str) -> timedelta:
    # Imported here: contracts.py imports this module at its top.
    from effect_broker.domain.contracts import parse_duration

    try:
        return parse_duration(raw.get(key, default))
    except ValueError as exc:
        raise ValueError(f"{where}.{key}: {exc}") from exc


def _pointer(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    # RFC 6901: "" is the whole document, anything else starts with "/".
    if not isinstance(value, str) or (value and not value.startswith("/")):
        raise ValueError(f'{where}.{key}: must be a JSON pointer such as "/status"')
    return value


def parse_answer_reading(raw: object, where: str, *, lookup: bool) -> AnswerReading:
    """Parse an ``answer`` / ``lookup_answer`` table; raise ``ValueError``."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a table ([contract.{where}])")
    for key in raw:
        if key not in _ANSWER_FIELDS:
            raise ValueError(
                f"{where}.{key}: {contract_fields.unknown_key(key, _ANSWER_FIELDS)}"
            )
    if ("pointer" in raw) == ("pattern" in raw):
        raise ValueError(
            f"{where}.pointer: give exactly one of pointer (a JSON pointer into the "
            "answer's JSON) or pattern (a regular expression over its text)"
        )
    pointer = _pointer(raw, "pointer", where)
    pattern = _text(raw, "pattern", where)
    id_pattern = _text(raw, "id_pattern", where)
    for name, regex in (("pattern", pattern), ("id_pattern", id_pattern)):
        if regex is None:
            continue
        try:
            re.compile(regex)
        except re.error as exc:
            raise ValueError(f"{where}.{name}: not a regular expression: {exc}") from exc
    if pattern is not None and "id_pointer" in raw:
        raise ValueError(f"{where}.id_pointer: with a pattern, use id_pattern")
    if pointer is not None and id_pattern is not None:
        raise ValueError(f"{where}.id_pattern: with a pointer, use id_pointer")
    lists = {
        name: _texts(raw, name, where)
        for name in ("committed", "not_committed", "failed", "already_done")
    }
    if lookup:
        if lists["already_done"]:
            raise ValueError(f"{where}.already_done: only for a call's answer")
        for required in ("committed", "not_committed"):
            if not lists[required]:
                # A lookup that cannot say one of the two proves nothing that way.
                raise ValueError(
                    f"{where}.{required}: required: a lookup must prove both ways"
                )
    elif not any(lists.values()):
        raise ValueError(
            f"{where}.committed: list at least one of committed, not_committed, "
            "failed, already_done"
        )
    seen: dict[str, str] = {}
    for name, values in lists.items():
        for value in values:
            if value in seen:
                raise ValueError(
                    f"{where}.{name}: {value!r} is also in {seen[value]}; a value has "
                    "one meaning"
                )
            seen[value] = name
    return AnswerReading(
        pointer=pointer,
        pattern=pattern,
        id_pointer=_pointer(raw, "id_pointer", where),
        id_pattern=id_pattern,
        committed=lists["committed"],
        not_committed=lists["not_committed"],
        failed=lists["failed"],
        already_done=lists["already_done"],
    )


def parse_upstream(
    raw: object, source: str, *, where: str = "upstream", default_tool: str | None = None
) -> McpUpstream:
    """Parse an upstream table; raise ``ValueError("<field>: <reason>")``."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be a table ([contract.{where}])")
    for key in raw:
        if key not in _UPSTREAM_FIELDS:
            raise ValueError(
                f"{where}.{key}: {contract_fields.unknown_key(key, _UPSTREAM_FIELDS)}"
            )
    if ("command" in raw) == ("url" in raw):
        raise ValueError(
            f"{where}.command: give exactly one of command (a stdio server) or url "
            "(a streamable HTTP server)"
        )
    command: tuple[str, ...] = ()
    url = _text(raw, "url", where)
    if url is not None and not url.startswith(("http://", "https://")):
        raise ValueError(f"{where}.url: must be an http:// or https:// URL")
    if "command" in raw:
        executable = _text(raw, "command", where)
        if executable == THIS_PYTHON:
            # The interpreter running the broker, its virtualenv's: a bare "python"
            # is not that on a clean machine (issue 20: the shipped examples started
            # the system's, or none).
            executable = sys.executable
        command = (executable, *_texts(raw, "args", where))
    else:
        for stdio_only in ("args", "cwd", "env", "inherit_env"):
            if stdio_only in raw:
                raise ValueError(f"{where}.{stdio_only}: only for a stdio command")
    if "bearer_token_env" in raw and url is None:
        raise ValueError(f"{where}.bearer_token_env: only for a url")
    cwd = _text(raw, "cwd", where)
    if cwd is not None and not os.path.isabs(cwd) and not source.startswith("<"):
        # Relative to the contracts file, made absolute now: the server starts later,
        # from whatever directory the broker process runs in.
        cwd = os.path.normpath(os.path.abspath(Path(source).parent / cwd))
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError(f"{where}.env: must be a table of strings")
    tool = _text(raw, "tool", where, default_tool)
    if tool is None:
        raise ValueError(f"{where}.tool: is required (the upstream tool's name)")
    tool_error = raw.get("tool_error", DEFAULT_TOOL_ERROR)
    if tool_error not in TOOL_ERROR_CLASSES:
        raise ValueError(
            f"{where}.tool_error: must be one of {', '.join(TOOL_ERROR_CLASSES)}"
        )
    codes = raw.get("terminal_rpc_codes", [METHOD_NOT_FOUND])
    if not isinstance(codes, list) or not all(
        isinstance(c, int) and not isinstance(c, bool) for c in codes
    ):
        raise ValueError(f"{where}.terminal_rpc_codes: must be a list of integers")
    for code in codes:
        if code in CLIENT_MADE_CODES:
            # The client makes these itself when the answer never came (connection
            # closed, timed out): they prove nothing about the tool.
            raise ValueError(
                f"{where}.terminal_rpc_codes: {code} is the client's own 'no answer' "
                "code and can never be terminal"
            )
    lists = {
        name: _texts(raw, name, where)
        for name in ("retryable_errors", "unknown_errors", "terminal_errors")
    }
    seen: dict[str, str] = {}
    for name, values in lists.items():
        for value in values:
            if value in seen:
                raise ValueError(
                    f"{where}.{name}: {value!r} is also in {seen[value]}; an error "
                    "code has one meaning"
                )
            seen[value] = name
    lookup_tool = _text(raw, "lookup_tool", where)
    for lookup_only in ("lookup_argument", "lookup_by", "found_field"):
        if lookup_only in raw and lookup_tool is None:
            raise ValueError(f"{where}.{lookup_only}: needs a lookup_tool")
    key_argument = _text(raw, "key_argument", where)
    lookup_by = _text(raw, "lookup_by", where, "downstream_key")
    if lookup_tool is not None and lookup_by == "downstream_key" and not key_argument:
        # The lookup finds the call by the key the call carried; without a key
        # argument the upstream never saw it.
        raise ValueError(
            f"{where}.lookup_by: a lookup by the downstream key needs key_argument "
            "(the argument that carries it); or name a business-key argument"
        )
    answer = (
        parse_answer_reading(raw["answer"], f"{where}.answer", lookup=False)
        if "answer" in raw
        else None
    )
    if answer is not None and answer.already_done and not key_argument:
        # "Already exists" proves a commit only of the key the broker sent.
        raise ValueError(
            f"{where}.answer.already_done: needs key_argument (the key that already "
            "took effect)"
        )
    lookup_answer = None
    if "lookup_answer" in raw:
        if lookup_tool is None:
            raise ValueError(f"{where}.lookup_answer: needs a lookup_tool")
        if "found_field" in raw:
            raise ValueError(
                f"{where}.lookup_answer: give either found_field or lookup_answer"
            )
        lookup_answer = parse_answer_reading(
            raw["lookup_answer"], f"{where}.lookup_answer", lookup=True
        )
    return McpUpstream(
        tool=tool,
        command=command,
        cwd=cwd,
        env=MappingProxyType(dict(env)),
        inherit_env=_texts(raw, "inherit_env", where),
        url=url,
        bearer_token_env=_text(raw, "bearer_token_env", where),
        key_argument=key_argument,
        lookup_tool=lookup_tool,
        lookup_argument=_text(raw, "lookup_argument", where),
        lookup_by=lookup_by,
        found_field=_text(raw, "found_field", where, "found"),
        external_id_field=_text(raw, "external_id_field", where, "id"),
        error_field=_text(raw, "error_field", where, "error"),
        tool_error=tool_error,
        retryable_errors=lists["retryable_errors"],
        unknown_errors=lists["unknown_errors"],
        terminal_errors=lists["terminal_errors"],
        terminal_rpc_codes=tuple(codes),
        connect_timeout=_duration(raw, "connect_timeout", where, "10s"),
        timeout=_duration(raw, "timeout", where, "10s"),
        answer=answer,
        lookup_answer=lookup_answer,
    )


def parse_passthrough(raw: object, source: str) -> PassThroughTool:
    """Parse one ``[[passthrough]]`` table; raise ``ValueError("<field>: <reason>")``."""
    if not isinstance(raw, dict):
        raise ValueError("passthrough: each [[passthrough]] entry must be a table")
    for key in raw:
        if key not in _PASSTHROUGH_FIELDS:
            raise ValueError(
                f"{key}: {contract_fields.unknown_key(key, _PASSTHROUGH_FIELDS)}"
            )
    tool = _text(raw, "tool", "passthrough")
    if tool is None:
        raise ValueError("tool: is required (the name the broker lists)")
    if "read_only" not in raw or not isinstance(raw["read_only"], bool):
        # Required, never defaulted: whether a tool mutates is a claim someone makes
        # on purpose, and strict mode reads it.
        raise ValueError("read_only: is required, true or false")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise ValueError("description: must be a string")
    upstream = parse_upstream(raw.get("upstream"), source, default_tool=tool)
    for contract_only in ("key_argument", "lookup_tool"):
        if getattr(upstream, contract_only) is not None:
            raise ValueError(
                f"upstream.{contract_only}: a pass-through has no ledger; declare a "
                '[[contract]] with adapter = "mcp" instead'
            )
    return PassThroughTool(
        tool=tool,
        upstream=upstream,
        read_only=raw["read_only"],
        description=description,
    )


__all__ = [
    "DEFAULT_TOOL_ERROR",
    "METHOD_NOT_FOUND",
    "TOOL_ERROR_CLASSES",
    "AnswerReading",
    "McpUpstream",
    "PassThroughTool",
    "parse_answer_reading",
    "parse_passthrough",
    "parse_upstream",
]
