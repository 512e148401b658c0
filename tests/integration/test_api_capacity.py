"""A full API process answers 503 ``overloaded`` (problem+json, Retry-After), never a
500, when no database connection can be had, and does nothing for that request; the
admin's login still works with the API's leaner middleware.

The pool here is Django's own, switched on for the test's connection; the acceptance
tests (tests/acceptance/test_api_server.py) do the same through a real uvicorn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, cast

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper
from django.test import Client
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from effect_broker.api.problems import capacity_reason
from effect_broker.models import EffectIntent
from effect_broker.services.tenants import create_tenant

BODY: dict[str, Any] = {
    "operation_key": "order:7:charge:v1",
    "tool": "charge_card",
    "arguments": {"order": "7", "amount_minor": 500, "currency": "EUR"},
}


@pytest.fixture
def api_key(transactional_db: None) -> str:
    return create_tenant("capacity-tenant")[1]


@pytest.fixture
def pool_of_one(api_key: str) -> Iterator[ConnectionPool]:
    """This thread's connection now comes from a pool of one, 0.3 s timeout."""
    wrapper = cast(PostgresWrapper, connection)
    options = wrapper.settings_dict["OPTIONS"]
    wrapper.close()
    options["pool"] = {"min_size": 1, "max_size": 1, "timeout": 0.3}
    try:
        pool = wrapper.pool
        pool.open(wait=True)  # as Django does on the first connection
        yield pool
    finally:
        wrapper.close()
        wrapper.close_pool()
        del options["pool"]


def post(client: Client, key: str) -> Any:
    return client.post(
        "/v1/effects",
        data=json.dumps(BODY),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )


def intents_with_key(conn: psycopg.Connection[Any], key: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM effect_intents WHERE operation_key = %s", (key,)
    ).fetchone()
    return int(row[0]) if row else -1


def test_pool_exhaustion_is_503_overloaded_with_retry_after_and_does_nothing(
    pool_of_one: ConnectionPool, api_key: str
) -> None:
    client = Client(raise_request_exception=False)
    held = pool_of_one.getconn()  # the pool's only connection: nothing is left
    try:
        response = post(client, api_key)
        assert response.status_code == 503, response.content
        assert response["Content-Type"] == "application/problem+json"
        assert response["Retry-After"] == "1"
        body = response.json()
        assert (body["status"], body["code"], body["reason"]) == (
            503,
            "overloaded",
            "database_pool",
        )
        assert "Traceback" not in response.content.decode()
        assert intents_with_key(held, BODY["operation_key"]) == 0
    finally:
        pool_of_one.putconn(held)
    # Once a connection is free the same request goes through.
    assert post(client, api_key).status_code == 202
    assert EffectIntent.objects.filter(operation_key=BODY["operation_key"]).count() == 1


def test_admin_pages_are_503_overloaded_too_when_the_pool_is_empty(
    pool_of_one: ConnectionPool,
) -> None:
    user = User.objects.create_superuser("olga", "olga@example.invalid", "s3cret-pass")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    connection.close()  # give this thread's pooled connection back
    held = pool_of_one.getconn()
    try:
        response = client.get("/admin/")  # loads the session: needs a connection
    finally:
        pool_of_one.putconn(held)
    assert response.status_code == 503, response.content[:300]
    assert response["Content-Type"] == "application/problem+json"
    assert response["Retry-After"] == "1"
    assert response.json()["reason"] == "database_pool"
    assert client.get("/admin/").status_code == 200


def test_health_needs_no_connection_even_when_the_pool_is_empty(
    pool_of_one: ConnectionPool,
) -> None:
    held = pool_of_one.getconn()
    try:
        assert Client().get("/healthz").status_code == 200
    finally:
        pool_of_one.putconn(held)


def test_a_refused_connection_is_overloaded_too() -> None:
    # PostgreSQL's own limit (SQLSTATE 53300) also fails before any statement ran.
    assert capacity_reason(pg_errors.TooManyConnections("too many clients")) == (
        "database_connections"
    )
    assert capacity_reason(PoolTimeout("no connection")) == "database_pool"
    assert capacity_reason(pg_errors.UndefinedTable("no such table")) is None


@pytest.mark.django_db
def test_admin_login_works_with_csrf_enforced() -> None:
    User.objects.create_superuser("olga", "olga@example.invalid", "s3cret-pass")
    client = Client(enforce_csrf_checks=True)
    page = client.get("/admin/login/")
    assert page.status_code == 200
    token = page.cookies["csrftoken"].value
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "olga", "password": "s3cret-pass", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302, response.content[:500]
    assert response["Location"] == "/admin/"
    index = client.get("/admin/")
    assert index.status_code == 200
    assert b"Site administration" in index.content


@pytest.mark.django_db
def test_admin_login_refuses_a_wrong_password() -> None:
    User.objects.create_superuser("olga", "olga@example.invalid", "s3cret-pass")
    client = Client(enforce_csrf_checks=True)
    token = client.get("/admin/login/").cookies["csrftoken"].value
    response = client.post(
        "/admin/login/?next=/admin/",
        {"username": "olga", "password": "wrong", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 200
    assert client.get("/admin/").status_code == 302  # still sent to the login page


def test_api_requests_skip_session_auth_and_messages(api_key: str) -> None:
    client = Client()
    response = post(client, api_key)
    assert response.status_code == 202
    request = response.wsgi_request  # the request the view saw
    for attribute in ("session", "user", "_messages"):
        assert not hasattr(request, attribute)
    assert "Cookie" not in response.get("Vary", "")
    assert not response.cookies
    admin = client.get("/admin/login/").wsgi_request
    assert all(hasattr(admin, a) for a in ("session", "user", "_messages"))
