"""Process roles and what each gets (config/capacity.py): the API's pool and its refusal
of persistent connections, the workers' pool, nothing for other commands."""

from __future__ import annotations

import os
import warnings

import pytest

from config import capacity
from config.capacity import (
    API,
    CLI,
    WORKER,
    Admission,
    ConnectionSettingIgnored,
    PoolSize,
)
from effect_broker.domain.errors import ConfigurationError

POOL_ENV = [
    f"EFFECT_BROKER_{role}_DB_POOL_{part}"
    for role in ("API", "WORKER")
    for part in ("MIN_SIZE", "MAX_SIZE", "TIMEOUT")
] + [
    "EFFECT_BROKER_PROCESS_ROLE",
    "EFFECT_BROKER_API_MAX_IN_FLIGHT",
    "EFFECT_BROKER_API_MAX_QUEUED",
    "EFFECT_BROKER_API_QUEUE_TIMEOUT",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in POOL_ENV:
        monkeypatch.delenv(name, raising=False)


def entry(max_age: int = 0) -> dict[str, object]:
    """A DATABASES entry as config.database builds it."""
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "effect_broker",
        "OPTIONS": {"sslmode": "disable"},
        "CONN_MAX_AGE": max_age,
        "CONN_HEALTH_CHECKS": max_age > 0,
    }


# --- which role -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "role"),
    [
        (["worker"], WORKER),
        (["worker", "--concurrency", "2"], WORKER),
        (["reconciler"], WORKER),
        (["dev"], CLI),
        (["procrastinate", "worker"], WORKER),
        (["procrastinate", "worker", "--concurrency", "4"], WORKER),
        (["procrastinate", "--verbose", "worker"], WORKER),
        (["procrastinate", "defer", "worker"], CLI),
        (["migrate"], CLI),
        (["bench", "--quick"], CLI),
        ([], CLI),
    ],
)
def test_the_worker_command_is_the_worker_role(args: list[str], role: str) -> None:
    assert capacity.role_for_command(args) == role


def test_the_role_defaults_to_cli_and_refuses_unknown_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert capacity.process_role() == CLI
    monkeypatch.setenv("EFFECT_BROKER_PROCESS_ROLE", " API ")
    assert capacity.process_role() == API
    monkeypatch.setenv("EFFECT_BROKER_PROCESS_ROLE", "web")
    with pytest.raises(ConfigurationError) as err:
        capacity.process_role()
    assert str(err.value) == (
        "EFFECT_BROKER_PROCESS_ROLE must be one of api, worker, cli, got 'web'"
    )


# --- pools ----------------------------------------------------------------------------


def test_default_pools_per_role() -> None:
    assert capacity.pool_size(API) == PoolSize(min_size=2, max_size=8, timeout=5.0)
    assert capacity.pool_size(WORKER) == PoolSize(min_size=2, max_size=10, timeout=30.0)
    assert capacity.pool_size(CLI) is None


def test_each_role_reads_its_own_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECT_BROKER_API_DB_POOL_MAX_SIZE", "4")
    monkeypatch.setenv("EFFECT_BROKER_API_DB_POOL_MIN_SIZE", "1")
    monkeypatch.setenv("EFFECT_BROKER_API_DB_POOL_TIMEOUT", "0.5")
    monkeypatch.setenv("EFFECT_BROKER_WORKER_DB_POOL_MAX_SIZE", "20")
    assert capacity.pool_size(API) == PoolSize(min_size=1, max_size=4, timeout=0.5)
    assert capacity.pool_size(WORKER) == PoolSize(min_size=2, max_size=20, timeout=30.0)


def test_a_max_size_below_the_default_min_lowers_the_min(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EFFECT_BROKER_API_DB_POOL_MAX_SIZE", "1")
    assert capacity.pool_size(API) == PoolSize(min_size=1, max_size=1, timeout=5.0)


def test_max_size_zero_turns_the_pool_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECT_BROKER_WORKER_DB_POOL_MAX_SIZE", "0")
    assert capacity.pool_size(WORKER) is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE",
            "eight",
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE must be a whole number >= 0, got 'eight'",
        ),
        (
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE",
            "-1",
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE must be a whole number >= 0, got '-1'",
        ),
        (
            "EFFECT_BROKER_WORKER_DB_POOL_TIMEOUT",
            "0",
            "EFFECT_BROKER_WORKER_DB_POOL_TIMEOUT must be a number >= 0.001, got '0'",
        ),
        (
            "EFFECT_BROKER_API_DB_POOL_TIMEOUT",
            "nan",
            "EFFECT_BROKER_API_DB_POOL_TIMEOUT must be a number >= 0.001, got 'nan'",
        ),
        (
            "EFFECT_BROKER_API_DB_POOL_MIN_SIZE",
            "9",
            "EFFECT_BROKER_API_DB_POOL_MIN_SIZE (9) must not exceed "
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE (8)",
        ),
    ],
)
def test_bad_pool_values_are_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    role = API if "_API_" in name else WORKER
    with pytest.raises(ConfigurationError) as err:
        capacity.pool_size(role)
    assert str(err.value) == message


def test_the_api_gets_a_pool_with_health_checks_and_no_persistent_connections() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning without CONN_MAX_AGE
        result = capacity.apply_role(entry(), API)
    assert result["OPTIONS"] == {
        "sslmode": "disable",
        "pool": {
            "min_size": 2,
            "max_size": 8,
            "timeout": 5.0,
            "name": "effect-broker-api",
            # Issue 11: the backoff restarts after 5 s, so a request soon after an
            # outage does not wait for a retry scheduled a minute later.
            "reconnect_timeout": 5.0,
        },
    }
    assert result["CONN_MAX_AGE"] == 0
    assert result["CONN_HEALTH_CHECKS"] is True


def test_the_api_ignores_conn_max_age_with_a_warning() -> None:
    # Issue 13: CONN_MAX_AGE=300 on the API leaked one connection per request under
    # ASGI until PostgreSQL refused clients (45% of submits were 500s).
    with pytest.warns(ConnectionSettingIgnored, match="ignored by the API process"):
        result = capacity.apply_role(entry(max_age=300), API)
    assert result["CONN_MAX_AGE"] == 0
    assert "pool" in result["OPTIONS"]


def test_the_api_ignores_conn_max_age_even_without_a_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EFFECT_BROKER_API_DB_POOL_MAX_SIZE", "0")
    with pytest.warns(ConnectionSettingIgnored, match="ignored by the API process"):
        result = capacity.apply_role(entry(max_age=300), API)
    assert result["CONN_MAX_AGE"] == 0
    assert result["CONN_HEALTH_CHECKS"] is False
    assert "pool" not in result["OPTIONS"]


def test_a_pooled_worker_ignores_conn_max_age_with_a_warning() -> None:
    with pytest.warns(ConnectionSettingIgnored, match="keeps its connections in a pool"):
        result = capacity.apply_role(entry(max_age=300), WORKER)
    assert result["CONN_MAX_AGE"] == 0
    assert result["OPTIONS"]["pool"]["max_size"] == 10


def test_a_worker_without_a_pool_keeps_persistent_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EFFECT_BROKER_WORKER_DB_POOL_MAX_SIZE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = capacity.apply_role(entry(max_age=300), WORKER)
    assert result["CONN_MAX_AGE"] == 300
    assert result["CONN_HEALTH_CHECKS"] is True
    assert "pool" not in result["OPTIONS"]


def test_a_command_is_left_as_configured() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert capacity.apply_role(entry(max_age=60), CLI) == entry(max_age=60)


def test_apply_role_does_not_change_its_input() -> None:
    original = entry(max_age=0)
    capacity.apply_role(original, API)
    assert original == entry(max_age=0)


# --- the in-flight limit --------------------------------------------------------------


def test_the_in_flight_limit_defaults_to_the_api_pool_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EFFECT_BROKER_API_DB_POOL_MAX_SIZE", "5")
    database = capacity.apply_role(entry(), API)
    assert capacity.admission(API, database) == Admission(
        max_in_flight=5, max_queued=1000, queue_timeout=5.0
    )
    assert capacity.admission(CLI, entry()).max_in_flight == 8


def test_the_in_flight_limit_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECT_BROKER_API_MAX_IN_FLIGHT", "3")
    monkeypatch.setenv("EFFECT_BROKER_API_MAX_QUEUED", "0")
    monkeypatch.setenv("EFFECT_BROKER_API_QUEUE_TIMEOUT", "0.25")
    assert capacity.admission(API, capacity.apply_role(entry(), API)) == Admission(
        max_in_flight=3, max_queued=0, queue_timeout=0.25
    )
    monkeypatch.setenv("EFFECT_BROKER_API_MAX_IN_FLIGHT", "0")
    with pytest.raises(ConfigurationError, match="MAX_IN_FLIGHT must be a whole number"):
        capacity.admission(API, entry())


@pytest.mark.parametrize(
    ("argv", "role"),
    [(["procrastinate", "worker", "--concurrency", "2"], WORKER), (["migrate"], CLI)],
)
def test_the_cli_declares_the_role_before_settings_load(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], role: str
) -> None:
    import django.core.management

    from effect_broker import cli

    seen: list[str | None] = []
    monkeypatch.setattr(
        django.core.management,
        "execute_from_command_line",
        lambda args: seen.append(os.environ.get("EFFECT_BROKER_PROCESS_ROLE")),
    )
    # Even when the shared environment says otherwise: the command decides.
    monkeypatch.setenv("EFFECT_BROKER_PROCESS_ROLE", API)
    assert cli.main(argv) == 0
    assert seen == [role]
