"""Production settings that Django itself approves (issue 12, item 7).

``manage.py check --deploy`` reported four warnings under EFFECT_BROKER_ENV=production
(HSTS, SSL redirect, session and CSRF cookies), while the admin carries operator
sessions that can resolve effects. The production defaults now pass it; turning one of
them off brings its warning back, which is what shows this test can fail.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CHECK = ["check", "--deploy", "--fail-level", "WARNING"]


def check_deploy(**extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("EFFECT_BROKER_", "DJANGO_"))
    }
    env.update(
        EFFECT_BROKER_ENV="production",
        DATABASE_URL="postgresql://broker@db.invalid:5432/effect_broker",
        EFFECT_BROKER_MASTER_KEY=base64.b64encode(secrets.token_bytes(32)).decode(),
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="broker.example.com",
        **extra,
    )
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *DEPLOY_CHECK],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_production_defaults_pass_the_deploy_check() -> None:
    result = check_deploy()
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("switch", "warning"),
    [
        ({"EFFECT_BROKER_SSL_REDIRECT": "0"}, "security.W008"),
        ({"EFFECT_BROKER_HSTS_SECONDS": "0"}, "security.W004"),
        ({"EFFECT_BROKER_SECURE_COOKIES": "0"}, "security.W010"),
    ],
)
def test_turning_a_default_off_brings_its_warning_back(
    switch: dict[str, str], warning: str
) -> None:
    result = check_deploy(**switch)
    assert result.returncode != 0
    assert warning in result.stderr + result.stdout


@override_settings(SECURE_SSL_REDIRECT=True)
def test_the_redirect_spares_health_probes_but_not_the_api() -> None:
    client = Client()
    assert client.get("/healthz").status_code == 200
    response = client.post("/v1/effects", data={}, content_type="application/json")
    assert response.status_code == 301
    assert response["Location"].startswith("https://")


@override_settings(
    SECURE_SSL_REDIRECT=True, SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https")
)
def test_behind_a_tls_proxy_the_forwarded_scheme_is_trusted() -> None:
    response = Client().get("/v1/effects", headers={"X-Forwarded-Proto": "https"})
    assert response.status_code == 401  # reached the API: no redirect, no key
