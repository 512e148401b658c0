"""The shipped alert rules and dashboard (examples/observability/) read only metrics
the broker really exports, and the rules do what docs/observability.md says.

A renamed metric would leave an alert that can never fire: nothing else would notice.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import django_prometheus.db  # noqa: F401  (registers the django_db_* families)
import pytest
import yaml
from django_prometheus.middleware import Metrics
from prometheus_client import REGISTRY

from effect_broker.observability import collectors, control_collectors, metrics

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "observability"
ALERTS = EXAMPLES / "alerts.yml"
DASHBOARD = EXAMPLES / "grafana-dashboard.json"

#: The spec's correctness alerts, each of which must ship (spec "Required
#: observability": unsafe unknown, unknown age, retry after key expiry, payload
#: drift, stale-worker writes).
REQUIRED_ALERTS = {
    "EffectBrokerUnsafeOutcomeUnknown",
    "EffectBrokerUnknownOutcomeTooOld",
    "EffectBrokerRetryAfterKeyExpiry",
    "EffectBrokerPayloadDrift",
    "EffectBrokerStaleWorkerWrite",
}
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("_sum", "_count", "_created", ""),
}
_NAME = re.compile(r"\b((?:effect_broker|django)_[a-zA-Z0-9_]+)\b")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def exported_series() -> set[str]:
    """Every series name the API and the workers can expose."""
    Metrics.get_instance()  # django-prometheus's HTTP families, as its middleware does
    names = set(collectors.METRIC_NAMES) | set(control_collectors.METRIC_NAMES)
    for family in REGISTRY.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def referenced(expr: str) -> set[str]:
    return set(_NAME.findall(_QUOTED.sub('""', expr)))


def rules() -> list[dict]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_metric_family_of_the_broker_is_exported() -> None:
    exported_series()
    families = {family.name for family in REGISTRY.collect()}
    assert {family._name for family in metrics.ALL} <= families


def test_every_alert_reads_exported_metrics_and_says_what_to_do() -> None:
    names = exported_series()
    found = rules()
    assert {rule["alert"] for rule in found} >= REQUIRED_ALERTS
    for rule in found:
        used = referenced(rule["expr"])
        assert used, rule["alert"]
        assert used <= names, (rule["alert"], used - names)
        assert rule["labels"]["severity"] in {"critical", "warning"}
        anchor = rule["annotations"]["runbook"].split("#")[1]
        assert anchor == rule["alert"].lower()


def test_the_retry_after_expiry_alert_reads_a_bucket_that_exists() -> None:
    # le="0.0" is how prometheus_client names the 0 bound; without that bound the
    # alert would match no series and never fire
    assert 0.0 in metrics.RETRY_RETENTION._upper_bounds
    (rule,) = [r for r in rules() if r["alert"] == "EffectBrokerRetryAfterKeyExpiry"]
    assert 'le="0.0"' in rule["expr"]


def test_the_runbooks_exist_in_the_docs() -> None:
    docs = (EXAMPLES.parents[1] / "docs" / "observability.md").read_text().lower()
    for rule in rules():
        assert f"### {rule['alert'].lower()}" in docs, rule["alert"]


def test_every_dashboard_query_reads_exported_metrics() -> None:
    names = exported_series()
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = referenced(target["expr"])
            assert used, (panel["title"], target["expr"])
            assert used <= names, (panel["title"], used - names)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert referenced(variable["query"]) <= names


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed")
@pytest.mark.parametrize(
    "args",
    [["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]],
    ids=["check", "unit-tests"],
)
def test_promtool_accepts_the_rules_and_their_unit_tests(args: list[str]) -> None:
    done = subprocess.run(
        ["promtool", *args],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
