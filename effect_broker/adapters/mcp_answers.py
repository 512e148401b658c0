"""Reading an upstream MCP tool's answer (issue 22, item 2).

Real MCP servers rarely answer in structured content: most answer a text block ("Created
repository eb-3f2a", "Error: repository eb-3f2a already exists", a JSON document
printed as text). A contract's ``[contract.upstream.answer]`` /
``[contract.upstream.lookup_answer]`` (``domain.upstream.AnswerReading``) says where
the one value that matters is - a JSON pointer into the structured content or into a
text block that parses as JSON, or a regular expression over the text - and what it
proves. This module only reads; the adapter decides (mcp_adapter.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import mcp.types as types
from pydantic import ValidationError

from effect_broker.domain.upstream import AnswerReading, McpUpstream

Meaning = Literal[
    "committed", "already_done", "not_committed", "failed", "other", "unread"
]
#: Longest text kept as evidence of an answer.
EVIDENCE_CHARS = 500
_MISSING = object()


@dataclass(frozen=True, slots=True)
class ReadAnswer:
    """The value read from an answer, what it means, and the answer as evidence."""

    meaning: Meaning
    value: str | None
    external_id: str | None
    #: The answer as read: its JSON document, or its text (cut at EVIDENCE_CHARS).
    evidence: dict[str, object]


def answer_text(result: types.CallToolResult) -> str:
    """The answer's text blocks, joined by newlines."""
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def resolve_pointer(document: object, pointer: str) -> object:
    """The value at an RFC 6901 JSON ``pointer`` in ``document``, or ``_MISSING``."""
    if pointer == "":
        return document
    value = document
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, Mapping):
            if part not in value:
                return _MISSING
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _scalar(value: object) -> str | None:
    # JSON spelling, so `committed = ["true"]` reads a boolean `found`.
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str | int | float) and value is not None:
        return str(value)
    return None


def _meaning(value: str, reading: AnswerReading) -> Meaning:
    for meaning in ("already_done", "committed", "not_committed", "failed"):
        if value in getattr(reading, meaning):
            return meaning
    return "other"


def _id_in_text(text: str, id_pattern: str | None) -> str | None:
    if id_pattern is None:
        return None
    match = re.search(id_pattern, text)
    if match is None:
        return None
    if "id" in match.groupdict():
        return match.group("id")
    return match.group(1) if match.re.groups else match.group(0)


def read_answer(
    result: types.CallToolResult, reading: AnswerReading, external_id_field: str
) -> ReadAnswer:
    """Read ``result`` as ``reading`` says (never raises)."""
    from effect_broker.adapters.mcp_adapter import json_path, result_document

    text = answer_text(result)
    if reading.pattern is not None:
        evidence: dict[str, object] = {"text": text[:EVIDENCE_CHARS]}
        found_id = _id_in_text(text, reading.id_pattern)
        match = re.search(reading.pattern, text)
        if match is None:
            return ReadAnswer("unread", None, found_id, evidence)
        groups = match.groupdict()
        value = groups.get("status") if "status" in groups else match.group(0)
        if value is None:
            return ReadAnswer("unread", None, found_id, evidence)
        return ReadAnswer(_meaning(value, reading), value, found_id, evidence)
    document = result_document(result)
    if document is None:
        return ReadAnswer("unread", None, None, {"text": text[:EVIDENCE_CHARS]})
    assert reading.pointer is not None
    value = _scalar(resolve_pointer(document, reading.pointer))
    if reading.id_pointer is not None:
        external = _scalar(resolve_pointer(document, reading.id_pointer))
    else:
        raw_id = json_path(document, external_id_field)
        external = None if isinstance(raw_id, bool) else _scalar(raw_id)
    evidence = {"document": document}
    if value is None:
        return ReadAnswer("unread", None, external, evidence)
    return ReadAnswer(_meaning(value, reading), value, external, evidence)


def external_id_of_rpc(message: Mapping[str, Any], upstream: McpUpstream) -> str | None:
    """The external id in a JSON-RPC ``tools/call`` answer, read as the adapter reads
    it (None for an error, or an answer that names none)."""
    from effect_broker.adapters.mcp_adapter import json_path, result_document

    try:
        result = types.CallToolResult.model_validate(message.get("result"))
    except ValidationError:
        return None
    if upstream.answer is not None:
        read = read_answer(result, upstream.answer, upstream.external_id_field)
        if read.meaning in ("committed", "already_done", "other") and not (
            result.is_error and read.meaning == "other"
        ):
            return read.external_id
        return None
    if result.is_error:
        return None
    document = result_document(result)
    if document is None:
        return None
    value = json_path(document, upstream.external_id_field)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value)


__all__ = ["ReadAnswer", "answer_text", "external_id_of_rpc", "read_answer"]
