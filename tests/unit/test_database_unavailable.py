"""Which database errors mean "the database is out of reach" (503
``database_unavailable``) and which do not (issue 11)."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError as DjangoOperationalError
from psycopg import errors

from effect_broker.api.database_unavailable import unavailable_reason


def django_error(cause: BaseException) -> DjangoOperationalError:
    """As Django raises it: its own class, the driver's error as the cause."""
    try:
        raise DjangoOperationalError(str(cause)) from cause
    except DjangoOperationalError as exc:
        return exc


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        # connection refused, reset, closed: psycopg gives no SQLSTATE
        (
            psycopg.OperationalError("connection failed: Connection refused"),
            "connection_failed",
        ),
        (errors.ConnectionFailure("08006"), "connection_failed"),
        (errors.AdminShutdown("terminating connection"), "server_shutting_down"),
        (errors.CrashShutdown("crash of another server process"), "server_crashed"),
        (
            errors.CannotConnectNow("the database system is starting up"),
            "server_starting",
        ),
    ],
)
def test_an_outage_is_database_unavailable(cause: BaseException, reason: str) -> None:
    assert unavailable_reason(django_error(cause)) == reason
    assert unavailable_reason(cause) == reason


@pytest.mark.parametrize(
    "cause",
    [
        errors.TooManyConnections("too many clients"),  # 503 overloaded instead
        errors.QueryCanceled("canceling statement due to statement timeout"),
        errors.LockNotAvailable("could not obtain lock"),
        errors.UniqueViolation("duplicate key"),
        ValueError("not a database error"),
    ],
)
def test_other_errors_are_not_an_outage(cause: BaseException) -> None:
    assert unavailable_reason(django_error(cause)) is None
