"""Errors to HTTP in one place: every error leaves as ``application/problem+json``
(RFC 9457) with a stable ``code``; no traceback ever reaches a caller, whatever
``DEBUG`` says. Also the strict body parser every surface shares."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError as DjangoDatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin
from ninja import NinjaAPI
from ninja.errors import AuthenticationError as NinjaAuthenticationError
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser
from psycopg_pool import PoolTimeout

from effect_broker.domain.canonical import canonical_json, parse_json_strict
from effect_broker.domain.errors import (
    ERROR_CODES,
    AuthenticationError,
    DatabaseConflictError,
    EffectBrokerError,
    InvalidJsonError,
    OverloadedError,
    PayloadTooLargeError,
    UnknownFieldError,
    UnsupportedMediaTypeError,
)
from effect_broker.domain.storable_text import require_storable

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
_PROBLEM_MEMBERS = frozenset({"type", "title", "status", "code", "detail"})
#: RFC 6750: a 401 names the scheme the caller should use.
WWW_AUTHENTICATE = "Bearer"


def max_body_bytes() -> int:
    """The body-size limit (``EFFECT_BROKER_MAX_BODY_BYTES``), enforced before the
    body is read by ``effect_broker.api.body_limit`` and again here."""
    return int(settings.EFFECT_BROKER_MAX_BODY_BYTES)


def is_json_media_type(content_type: str) -> bool:
    """``application/json`` or a ``+json`` type (parameters already stripped)."""
    kind = content_type.strip().lower()
    return kind == "application/json" or (
        kind.startswith("application/") and kind.endswith("+json")
    )


class StrictJsonParser(Parser):
    """Parse bodies with the domain's strict JSON rules (no duplicate keys, no NaN,
    no underflow), as JSON only, and with text PostgreSQL can store."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        # Issue 12: a missing or wrong Content-Type was parsed as JSON anyway.
        if not is_json_media_type(request.content_type or ""):
            raise UnsupportedMediaTypeError(
                f"the body must be sent as application/json, not "
                f"{request.content_type or 'no Content-Type'}"
            )
        limit = max_body_bytes()
        if len(request.body) > limit:
            raise PayloadTooLargeError(f"request body exceeds {limit} bytes", limit=limit)
        value = parse_json_strict(request.body)
        if not isinstance(value, dict):
            raise InvalidJsonError("request body must be a JSON object")
        # The one place a body's text is checked against what PostgreSQL refuses, for
        # every field of every operation (issue 12: NUL in any of them was a 500).
        require_storable(value)
        return value


#: Codes a surface answers that are no domain error: code -> (status, meaning, what
#: to do). With ``ERROR_CODES`` they are every code the API can emit (``catalogue``).
SURFACE_CODES: dict[str, tuple[int, str, str]] = {
    "internal_error": (
        500,
        "A fault of the broker's own; the detail is only in the server log.",
        "Resending with the same operation key is safe: it reserves the effect or "
        "replays the one an earlier request reserved. Report it with the time.",
    ),
    "http_error": (
        400,
        "The HTTP stack refused the request with this status before the broker's "
        "code ran; `detail` is the status's phrase.",
        "Read the status and `detail`, fix the request and resend.",
    ),
    "not_ready": (
        503,
        "This broker is not ready to serve (answered by /readyz only); `reasons` "
        "lists what is missing.",
        "Wait and ask again: database, migrations, contracts or a live worker is "
        "missing. A load balancer routes elsewhere meanwhile.",
    ),
}


def catalogue() -> dict[str, tuple[int, str, str]]:
    """Every code the API can emit: code -> (status, meaning, what to do)."""
    found = {
        code: (cls.http_status, cls.default_message(), cls.remedy)
        for code, cls in ERROR_CODES.items()
    }
    return dict(sorted({**found, **SURFACE_CODES}.items()))


def problem_type(code: str) -> str:
    """The problem's ``type``: the page that explains ``code`` and what to do.

    By default ``/problems/{code}``, a page every broker serves itself
    (``effect_broker.api.problem_pages``): a relative reference, which RFC 9457
    resolves against the request's URI, so it resolves wherever the answer came
    from with no docs host to keep alive. ``EFFECT_BROKER_PROBLEM_BASE_URL`` makes
    it absolute (a published docs page, e.g. ``.../reference/errors.html#``).
    """
    return f"{settings.EFFECT_BROKER_PROBLEM_BASE_URL}{code}"


def problem_document(
    status: int, code: str, detail: str, **extra: object
) -> dict[str, object]:
    """The RFC 9457 problem document."""
    return {
        "type": problem_type(code),
        "title": code.replace("_", " "),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }


def problem_body(status: int, code: str, detail: str, **extra: object) -> bytes:
    """The RFC 9457 problem document, as the bytes sent."""
    return canonical_json(problem_document(status, code, detail, **extra))


def problem(status: int, code: str, detail: str, **extra: object) -> HttpResponse:
    """Build an RFC 9457 problem response (a 401 with ``WWW-Authenticate``)."""
    response = HttpResponse(
        problem_body(status, code, detail, **extra),
        status=status,
        content_type=PROBLEM_JSON,
    )
    if status == 401:
        response["WWW-Authenticate"] = WWW_AUTHENTICATE
    return response


# --- capacity: one 503 for every way the process can be full ---------------------------

#: Seconds a refused caller should wait; a request slot or connection frees in ms.
RETRY_AFTER_SECONDS = 1


def overloaded_body(reason: str) -> bytes:
    """The 503 ``overloaded`` problem document; ``reason`` says which limit was hit."""
    return problem_body(
        OverloadedError.http_status,
        OverloadedError.code,
        OverloadedError.default_message(),
        reason=reason,
    )


def overloaded(reason: str) -> HttpResponse:
    """503 ``overloaded`` with ``Retry-After``: nothing was done, try again shortly."""
    response = HttpResponse(
        overloaded_body(reason),
        status=OverloadedError.http_status,
        content_type=PROBLEM_JSON,
    )
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


#: SQLSTATE 53300: PostgreSQL itself has no connection slot left.
_TOO_MANY_CONNECTIONS = "53300"


def capacity_reason(exc: BaseException) -> str | None:
    """``database_pool`` / ``database_connections`` when ``exc`` (a Django database
    error or its psycopg cause) means no connection could be had; else None.

    Either happens while getting the request's first connection, before any
    statement ran, so the request did nothing and may be retried as it is.
    """
    cause = exc.__cause__ if isinstance(exc, DjangoDatabaseError) else exc
    if isinstance(cause, PoolTimeout):
        return "database_pool"
    if getattr(cause, "sqlstate", None) == _TOO_MANY_CONNECTIONS:
        return "database_connections"
    return None


def _problem_details(exc: EffectBrokerError) -> dict[str, object]:
    # A detail named like a problem member (e.g. "status") must not replace it.
    return {
        k: v
        for k, v in exc.details.items()
        if isinstance(v, str | int | bool) and k not in _PROBLEM_MEMBERS
    }


def domain_problem(exc: EffectBrokerError) -> dict[str, object]:
    """A domain error as the problem document ``domain_error`` would send, for an
    answer that carries problems inside it (a batch item's conflict)."""
    return problem_document(exc.http_status, exc.code, str(exc), **_problem_details(exc))


def domain_error(
    request: HttpRequest, exc: EffectBrokerError, *, status: int | None = None
) -> HttpResponse:
    """A domain error as its problem: its code, message and scalar details (and its
    own status, unless a surface's protocol says another: ``status``)."""
    response = problem(
        status or exc.http_status, exc.code, str(exc), **_problem_details(exc)
    )
    # A refusal that names when to come back (rate_limited) says so in the header
    # clients and proxies read, not only in the body.
    if isinstance(wait := exc.details.get("retry_after_seconds"), int):
        response["Retry-After"] = str(wait)
    return response


def _field(error: dict[str, Any]) -> str:
    # ninja's loc starts with where the value came from and, for a body, the name
    # of the body parameter: ("body", "body", "trace_id") is the field "trace_id".
    loc = [str(p) for p in error.get("loc", ())]
    if loc[:1] == ["body"]:
        loc = loc[2:]
    elif loc[:1] in (["query"], ["path"]):
        loc = [f"{loc[0]}.{loc[1]}", *loc[2:]] if len(loc) > 1 else loc
    return ".".join(loc)


def _validation_error(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    errors = list(exc.errors)
    unknown = [_field(e) for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:
        # Issue 12: unknown fields (tenant_id among them) were silently ignored.
        return problem(
            UnknownFieldError.http_status,
            UnknownFieldError.code,
            f"unknown field(s): {', '.join(unknown)}",
            field=unknown[0],
        )
    fields = [_field(e) for e in errors]
    detail = "; ".join(
        f"{f}: {e.get('msg', 'invalid')}" for f, e in zip(fields, errors, strict=True)
    )
    extra = {"field": fields[0]} if fields else {}
    return problem(422, "invalid_request", detail or "invalid request", **extra)


def _auth_error(request: HttpRequest, exc: NinjaAuthenticationError) -> HttpResponse:
    return problem(401, AuthenticationError.code, "missing or malformed credentials")


def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # ninja wraps parser failures in HttpError(400) "from" the original error; ours
    # carries the stable code and a precise message, so surface it.
    if isinstance(exc.__cause__, EffectBrokerError):
        return domain_error(request, exc.__cause__)
    return problem(exc.status_code, "http_error", str(exc))


class CapacityErrorMiddleware(MiddlewareMixin):
    """The same 503 ``overloaded`` for views outside the API (the admin), whose
    errors Django, not django-ninja, turns into responses.

    Only ``process_exception``: it costs nothing on a request that does not fail.
    """

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponse | None:
        return _refused_for_capacity(request, exception)  # None: Django's handling


def _refused_for_capacity(request: HttpRequest, exc: Exception) -> HttpResponse | None:
    reason = capacity_reason(exc)
    if reason is None:
        return None
    logger.warning(
        "refused: no database connection",
        extra={"action": "overloaded", "reason": reason, "path": request.path},
    )
    return overloaded(reason)


def _too_large(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    # Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE, set to the same figure) when a
    # body reaches Django at all, e.g. under WSGI: 413, not the 500 of issue 12.
    return domain_error(request, PayloadTooLargeError(limit=max_body_bytes()))


def database_error(request: HttpRequest, exc: DjangoDatabaseError) -> HttpResponse:
    """A database error: 503 ``overloaded`` when no connection was free, 503
    ``database_conflict`` for a deadlock or serialization failure, else 500.
    (``effect_broker.api.database_unavailable`` answers an outage before this.)"""
    # The store raises the conflict of a reservation as the domain error already;
    # this catches one from any other statement: never a 500 for it (issue 19).
    conflict = DatabaseConflictError.of(exc)
    if conflict is not None:
        return domain_error(request, conflict)
    return _refused_for_capacity(request, exc) or _unexpected(request, exc)


def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
    logger.exception("unhandled error", extra={"action": "api", "path": request.path})
    return problem(500, "internal_error", "internal error; see server logs")


def install_handlers(api: NinjaAPI) -> None:
    """Register the one handler per error family on ``api``."""
    api.exception_handler(EffectBrokerError)(domain_error)
    api.exception_handler(NinjaValidationError)(_validation_error)
    api.exception_handler(NinjaAuthenticationError)(_auth_error)
    api.exception_handler(HttpError)(_http_error)
    api.exception_handler(RequestDataTooBig)(_too_large)
    api.exception_handler(DjangoDatabaseError)(database_error)
    api.exception_handler(Exception)(_unexpected)
