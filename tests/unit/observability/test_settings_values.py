"""Who may read /metrics, and a worker's metrics port: parsed once, one clear error."""

from __future__ import annotations

import pytest

from effect_broker.domain.errors import ConfigurationError
from effect_broker.observability.settings_values import (
    metrics_access,
    worker_metrics_port,
)

TOKEN = "s3cret-scrape-token-0123"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "EFFECT_BROKER_METRICS",
        "EFFECT_BROKER_METRICS_TOKEN",
        "EFFECT_BROKER_WORKER_METRICS_PORT",
    ):
        monkeypatch.delenv(name, raising=False)


def test_metrics_are_public_in_development_and_off_in_production_by_default() -> None:
    assert metrics_access(production=False) == ("public", "")
    assert metrics_access(production=True) == ("off", "")


def test_a_token_makes_metrics_need_it_everywhere(monkeypatch) -> None:
    monkeypatch.setenv("EFFECT_BROKER_METRICS_TOKEN", TOKEN)
    assert metrics_access(production=True) == ("token", TOKEN)
    assert metrics_access(production=False) == ("token", TOKEN)


def test_production_may_choose_public_metrics_explicitly(monkeypatch) -> None:
    monkeypatch.setenv("EFFECT_BROKER_METRICS", "public")
    assert metrics_access(production=True) == ("public", "")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EFFECT_BROKER_METRICS": "open"}, "must be public, token or off, got 'open'"),
        ({"EFFECT_BROKER_METRICS": "token"}, "needs EFFECT_BROKER_METRICS_TOKEN"),
        (
            {"EFFECT_BROKER_METRICS_TOKEN": "short"},
            "needs EFFECT_BROKER_METRICS_TOKEN of at least 16 characters",
        ),
    ],
)
def test_a_bad_metrics_setting_is_one_clear_error(monkeypatch, env, message) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=message):
        metrics_access(production=False)


def test_the_worker_port_is_off_unless_set(monkeypatch) -> None:
    assert worker_metrics_port() is None
    monkeypatch.setenv("EFFECT_BROKER_WORKER_METRICS_PORT", "9464")
    assert worker_metrics_port() == 9464


@pytest.mark.parametrize("raw", ["0", "70000", "abc", "-1", "94 64"])
def test_a_bad_worker_port_is_refused(monkeypatch, raw) -> None:
    monkeypatch.setenv("EFFECT_BROKER_WORKER_METRICS_PORT", raw)
    with pytest.raises(ConfigurationError, match="must be a port number 1-65535"):
        worker_metrics_port()
