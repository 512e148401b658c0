"""Errors to HTTP in one place: every error leaves as ``application/problem+json``
(RFC 9457) with a stable ``code``; no traceback ever reaches a caller, whatever
``DEBUG`` says. Also the strict body parser every surface shares."""

from __future__ import annotations

import logging
from typing import Any

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
    AuthenticationError,
    EffectBrokerError,
    InvalidJsonError,
    OverloadedError,
)

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
MAX_BODY_BYTES = 256 * 1024
_PROBLEM_MEMBERS = frozenset({"type", "title", "status", "code", "detail"})


class StrictJsonParser(Parser):
    """Parse bodies with the domain's strict JSON rules (no duplicate keys, no NaN)."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        if len(request.body) > MAX_BODY_BYTES:
            raise InvalidJsonError(f"request body exceeds {MAX_BODY_BYTES} bytes")
        value = parse_json_strict(request.body)
        if not isinstance(value, dict):
            raise InvalidJsonError("request body must be a JSON object")
        return value


def problem_body(status: int, code: str, detail: str, **extra: object) -> bytes:
    """The RFC 9457 problem document, as the bytes sent."""
    body = {
        "type": f"https://effect-broker.invalid/problems/{code}",
        "title": code.replace("_", " "),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return canonical_json(body)


def problem(status: int, code: str, detail: str, **extra: object) -> HttpResponse:
    """Build an RFC 9457 problem response."""
    return HttpResponse(
        problem_body(status, code, detail, **extra),
        status=status,
        content_type=PROBLEM_JSON,
    )


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


def domain_error(request: HttpRequest, exc: EffectBrokerError) -> HttpResponse:
    """A domain error as its problem: its code, message and scalar details."""
    # A detail named like a problem member (e.g. "status") must not replace it.
    safe = {
        k: v
        for k, v in exc.details.items()
        if isinstance(v, str | int | bool) and k not in _PROBLEM_MEMBERS
    }
    return problem(exc.http_status, exc.code, str(exc), **safe)


def _validation_error(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
    fields = [".".join(str(p) for p in e.get("loc", ())) for e in exc.errors]
    detail = "; ".join(
        f"{f}: {e.get('msg', 'invalid')}" for f, e in zip(fields, exc.errors, strict=True)
    )
    return problem(422, "invalid_request", detail or "invalid request")


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


def _database_error(request: HttpRequest, exc: DjangoDatabaseError) -> HttpResponse:
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
    api.exception_handler(DjangoDatabaseError)(_database_error)
    api.exception_handler(Exception)(_unexpected)
