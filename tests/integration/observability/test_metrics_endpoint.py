"""The API's /metrics: django-prometheus's HTTP and query metrics, the broker's own,
and the ledger gauges - public in development, behind a token or off in production."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from effect_broker.observability.database import METERED_ENGINE

pytestmark = pytest.mark.django_db

TOKEN = "scrape-token-0123456789"


def families(body: bytes) -> dict[str, list]:
    return {
        family.name: family.samples
        for family in text_string_to_metric_families(body.decode())
    }


def test_metrics_expose_http_database_domain_and_ledger_families() -> None:
    client = Client()
    client.get("/healthz")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    found = families(response.content)
    # HTTP (django-prometheus), counted by our hop-free middleware
    statuses = {
        s.labels["view"]
        for s in found["django_http_responses_total_by_status_view_method"]
    }
    assert "effect_broker_api:healthz" in statuses
    # Domain families are declared even before anything happened
    assert "effect_broker_effects_submitted" in found
    # Ledger gauges, read at this scrape
    assert found["effect_broker_ledger_scrape_success"][0].value == 1
    if connection.settings_dict["ENGINE"] == METERED_ENGINE:
        # Query metrics wherever the database is named by DATABASE_URL
        assert any(s.value > 0 for s in found["django_db_execute"])


@override_settings(
    EFFECT_BROKER_METRICS_ACCESS="token", EFFECT_BROKER_METRICS_TOKEN=TOKEN
)
@pytest.mark.parametrize("header", [None, "Bearer wrong-token-0123456789", TOKEN])
def test_with_a_token_a_scrape_without_it_is_401_and_reads_nothing(header) -> None:
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = Client().get("/metrics", **extra)
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "unauthenticated"
    assert "Bearer" in response["WWW-Authenticate"]
    assert b"effect_broker_" not in response.content


@override_settings(
    EFFECT_BROKER_METRICS_ACCESS="token", EFFECT_BROKER_METRICS_TOKEN=TOKEN
)
def test_with_the_token_the_scrape_succeeds() -> None:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert b"effect_broker_ledger_scrape_success 1.0" in response.content


@override_settings(EFFECT_BROKER_METRICS_ACCESS="off")
def test_off_answers_404_like_a_route_that_does_not_exist() -> None:
    response = Client().get("/metrics")
    assert response.status_code == 404
    assert response.json()["code"] == "route_not_found"
