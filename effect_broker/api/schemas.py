"""Response and request schemas shared by the API's routers, and the one mapping of
an effect record to its wire shape."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import ConfigDict

from effect_broker.api.problems import PROBLEM_JSON, problem_type
from effect_broker.domain.pauses import Pause
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.services.inspection import ForkLinks


class ProblemOut(Schema):
    """An RFC 9457 problem (``application/problem+json``): how every error is answered.

    ``code`` is stable (docs/reference/http-api.md lists them); some problems add members,
    e.g. ``field`` (which input), ``limit``, ``effect_id``.
    """

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": "/problems/unstorable_text",
                    "title": "unstorable text",
                    "status": 422,
                    "code": "unstorable_text",
                    "detail": "trace_id contains NUL (U+0000), which cannot be stored",
                    "field": "trace_id",
                }
            ]
        },
    )

    type: str
    title: str
    status: int
    code: str
    detail: str


#: Statuses any request can be answered with before its operation runs: a bad Host
#: (400), a body over the limit (413), text PostgreSQL refuses in the path or query
#: (422), no capacity (503).
_ANY_REQUEST = (400, 413, 422, 503)


def with_problems(
    success: dict[int, Any], *statuses: int, authenticated: bool = True
) -> dict[int, Any]:
    """An operation's ``response=``: its success schemas and every error status it
    can answer, each a ``ProblemOut`` (issue 12: undeclared statuses)."""
    errors = {*_ANY_REQUEST, *statuses, *((401,) if authenticated else ())}
    return {**success, **{status: ProblemOut for status in sorted(errors)}}


class PausedOut(Schema):
    """Why a due effect is not being sent: an operator paused dispatch of its tool,
    contract or tenant (issue 24). It waits, it is not failed; nothing of it was
    sent while paused, and it is sent once the pause is resumed."""

    reason: str
    since: datetime
    #: What is paused, in words: "tool charge_card", "this tenant", ...
    scope: str


class EffectOut(Schema):
    """An effect as callers see it: state, never raw arguments."""

    effect_id: str
    operation_key: str
    tool: str
    contract: str
    safety_class: str
    status: str
    version: int
    attempt_count: int
    arguments_preview: dict[str, Any]
    receipt_id: str | None
    created_at: datetime
    updated_at: datetime
    created: bool | None = None
    replayed: bool | None = None
    #: Fork links (spec "Replay and time-travel semantics"), where the response
    #: looked them up: the effect this one was forked from, and its fork.
    forked_from: str | None = None
    forked_to: str | None = None
    #: True while an attempt may have reached the target unanswered and nothing has
    #: proved what happened since. On a ``failed_final`` effect it means an operator
    #: gave up on it without proof that it did not take effect (issue 19, item 1).
    outcome_in_doubt: bool = False
    #: Set while an operator's pause holds the effect (issue 24): its next send
    #: waits for the pause to be resumed. Null otherwise.
    paused: PausedOut | None = None
    #: While ``status`` is ``awaiting_approval``: when the wait ends (database
    #: clock). Not approved by then, the effect ends failed_final (approval_expired)
    #: and is never sent (issue 24). Null in every other status.
    approval_deadline: datetime | None = None


def paused_out(pause: Pause | None) -> dict[str, Any] | None:
    """A pause as the effect's owner sees it (never who paused it)."""
    if pause is None:
        return None
    return {
        "reason": pause.reason,
        "since": pause.paused_at,
        "scope": pause.scope.describe(),
    }


def effect_out(
    record: EffectRecord,
    *,
    links: ForkLinks | None = None,
    pause: Pause | None = None,
    **flags: bool,
) -> dict[str, Any]:
    """The wire shape of ``record`` (with its fork links and the pause holding it,
    when the caller looked them up)."""
    out: dict[str, Any] = {
        "effect_id": record.effect_id,
        "operation_key": record.operation_key,
        "tool": record.tool,
        "contract": f"{record.contract_name}@{record.contract_version}",
        "safety_class": record.safety.value,
        "status": record.status.value,
        "version": record.version,
        "attempt_count": record.attempt_count,
        "arguments_preview": dict(record.arguments_preview),
        "receipt_id": record.receipt_id,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "outcome_in_doubt": record.outcome_in_doubt,
        "paused": paused_out(pause),
        "approval_deadline": approval_deadline(record),
        **flags,
    }
    if links is not None:
        out["forked_from"], out["forked_to"] = links.forked_from, links.forked_to
    return out


def approval_deadline(record: EffectRecord) -> datetime | None:
    """The deadline of an effect awaiting approval (its next action is its expiry)."""
    if record.status is EffectStatus.AWAITING_APPROVAL:
        return record.next_action_at
    return None


#: One example problem per error status, as the API answers it.
_EXAMPLE_BY_STATUS: dict[int, tuple[str, str]] = {
    400: ("disallowed_host", "the Host header names a host this broker does not serve"),
    401: ("unauthenticated", "missing or malformed credentials"),
    403: ("tenant_disabled", "this tenant is disabled"),
    404: ("effect_not_found", "no such effect"),
    409: ("payload_conflict", "operation key 'order:42:charge:v1' has another payload"),
    413: ("payload_too_large", "request body exceeds 262144 bytes"),
    415: ("unsupported_media_type", "the body must be sent as application/json"),
    422: ("unstorable_text", "trace_id contains NUL (U+0000), which cannot be stored"),
    503: ("overloaded", "too many requests in flight; nothing was done, retry"),
}


def problem_media_types(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (an OpenAPI document) with every error response declared as
    ``application/problem+json``, the media type the API sends (``problems``), with
    an example per status.

    django-ninja declares every response with the API's one renderer's media type
    (``application/json``); a client that checks the media type against the schema
    (schemathesis does) must see the one it gets.
    """
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if not str(status).isdigit() or int(status) < 400:
                    continue
                if "application/json" not in content:
                    continue
                media = content.pop("application/json")
                example = _EXAMPLE_BY_STATUS.get(int(status))
                if example is not None:
                    code, detail = example
                    media["example"] = {
                        "type": problem_type(code),
                        "title": code.replace("_", " "),
                        "status": int(status),
                        "code": code,
                        "detail": detail,
                    }
                content[PROBLEM_JSON] = media
    return schema
