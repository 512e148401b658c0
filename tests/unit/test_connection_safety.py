"""Every connection carries TCP keepalives and bounded timeouts (issue 11), so a
half-open connection fails in about a minute instead of hanging a worker for hours
(procrastinate #1596)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper

from config.database import (
    CONNECTION_SAFETY,
    SESSION_TIMEOUTS,
    connection_safety_options,
    database_from_url,
    session_timeouts,
    with_connection_safety,
)
from effect_broker.domain.errors import ConfigurationError

SAFETY = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}
#: Issue 19 item 7: the server-side limits every session starts with (README).
TIMEOUTS = {
    "lock_timeout": 5_000,
    "idle_in_transaction_session_timeout": 30_000,
    "statement_timeout": 600_000,
}
SESSION = (
    "-c lock_timeout=5000 -c idle_in_transaction_session_timeout=30000 "
    "-c statement_timeout=600000"
)


def test_the_defaults_declare_a_dead_peer_within_a_minute() -> None:
    assert connection_safety_options() == SAFETY
    assert {k: v[1] for k, v in CONNECTION_SAFETY.items()} == SAFETY
    idle, interval, count = 30, 10, 3
    assert idle + interval * count == SAFETY["tcp_user_timeout"] / 1000


def test_a_value_in_database_url_wins_over_the_default() -> None:
    entry = with_connection_safety(
        database_from_url("postgresql://u@db:5432/x?connect_timeout=3&sslmode=require")
    )
    assert entry["OPTIONS"] == {
        **SAFETY,
        "connect_timeout": "3",
        "sslmode": "require",
        "options": SESSION,
    }


def test_each_option_has_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EFFECT_BROKER_DB_KEEPALIVES_IDLE", "5")
    monkeypatch.setenv("EFFECT_BROKER_DB_CONNECT_TIMEOUT", "2")
    assert connection_safety_options() == {
        **SAFETY,
        "keepalives_idle": 5,
        "connect_timeout": 2,
    }


def test_a_bad_value_is_one_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECT_BROKER_DB_TCP_USER_TIMEOUT", "1m")
    with pytest.raises(ConfigurationError) as err:
        connection_safety_options()
    assert str(err.value) == (
        "EFFECT_BROKER_DB_TCP_USER_TIMEOUT must be a whole number >= 0, got '1m'"
    )


def test_django_and_the_procrastinate_worker_connect_with_them() -> None:
    # procrastinate's worker connector takes Django's connection parameters
    # (procrastinate.contrib.django.utils.connector_params); the stock PostgreSQL
    # wrapper builds them here without connecting (the embedded one would start
    # its server).
    entry = settings.DATABASES["default"]
    params = PostgresWrapper(
        {**entry, "NAME": entry["NAME"] or "x"}
    ).get_connection_params()
    assert {k: params.get(k) for k in SAFETY} == SAFETY


def test_every_session_starts_with_bounded_lock_idle_and_statement_times() -> None:
    assert session_timeouts() == TIMEOUTS
    assert {k: v[1] for k, v in SESSION_TIMEOUTS.items()} == TIMEOUTS
    entry = with_connection_safety(database_from_url("postgresql://u@db:5432/x"))
    assert entry["OPTIONS"]["options"] == SESSION


def test_options_in_database_url_come_after_the_defaults_so_they_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EFFECT_BROKER_DB_LOCK_TIMEOUT_MS", "250")
    entry = with_connection_safety(
        database_from_url(
            "postgresql://u@db:5432/x?options=-c%20statement_timeout%3D0"
            "%20-c%20search_path%3Dbroker"
        )
    )
    assert entry["OPTIONS"]["options"] == (
        "-c lock_timeout=250 -c idle_in_transaction_session_timeout=30000 "
        "-c statement_timeout=600000 -c statement_timeout=0 -c search_path=broker"
    )


def test_a_bad_timeout_is_one_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EFFECT_BROKER_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS", "30s")
    with pytest.raises(ConfigurationError) as err:
        session_timeouts()
    assert str(err.value) == (
        "EFFECT_BROKER_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS must be a whole number >= 0, "
        "got '30s'"
    )


def test_the_worker_pool_and_the_api_connect_with_the_timeouts() -> None:
    entry = settings.DATABASES["default"]
    params = PostgresWrapper(
        {**entry, "NAME": entry["NAME"] or "x"}
    ).get_connection_params()
    assert params["options"] == SESSION
