"""The admin's door (issue 19, item 12): 60 wrong passwords in a row were all tried,
and production created a superuser whose password was "1".

- After EFFECT_BROKER_ADMIN_LOGIN_MAX_FAILURES failures for one username from one
  address, that pair is refused, the right password too, until the window passes.
- Production's createsuperuser refuses a password Django's validators refuse, with
  ``--noinput`` too, and creates nobody.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from config.database import url_from_settings
from effect_broker.models import AdminLoginFailure

ROOT = Path(__file__).resolve().parents[2]
RIGHT = "correct-horse-battery-7"
LOGIN = "/admin/login/?next=/admin/"


def log_in(client: Client, password: str) -> Any:
    return client.post(LOGIN, {"username": "olga", "password": password})


def logged_in(response: Any) -> bool:
    return response.status_code == 302 and response["Location"] == "/admin/"


@pytest.fixture
def olga(db: None) -> User:
    return User.objects.create_superuser("olga", "olga@example.invalid", RIGHT)


def test_sixty_wrong_passwords_lock_the_username_and_address_out(
    olga: User, settings: Any
) -> None:
    settings.EFFECT_BROKER_ADMIN_LOGIN_MAX_FAILURES = 5
    attacker = Client(REMOTE_ADDR="203.0.113.9")
    # When 60 wrong passwords are tried in a row from one address
    answers = [log_in(attacker, f"guess-{n}") for n in range(60)]
    # Then none logs in, the first five are ordinary failures and the rest a lockout
    assert not any(logged_in(answer) for answer in answers)
    assert all(b"correct username and password" in a.content for a in answers[:5])
    assert all(b"Too many failed logins" in a.content for a in answers[5:])
    # And past the limit the password is not even checked
    assert AdminLoginFailure.objects.get().failures == 5
    # And the right password is refused too while the lockout lasts
    locked = log_in(attacker, RIGHT)
    assert not logged_in(locked)
    assert b"Try again in about 15 minute(s)" in locked.content
    # While the operator, from another address, is not locked out
    assert logged_in(log_in(Client(REMOTE_ADDR="198.51.100.7"), RIGHT))
    # When the window has passed, the right password logs in and clears the count
    AdminLoginFailure.objects.update(
        window_started_at=timezone.now() - timedelta(seconds=901)
    )
    assert logged_in(log_in(attacker, RIGHT))
    assert AdminLoginFailure.objects.filter(failures__gt=0).count() == 0


def test_a_success_before_the_limit_clears_the_count(olga: User, settings: Any) -> None:
    settings.EFFECT_BROKER_ADMIN_LOGIN_MAX_FAILURES = 3
    client = Client(REMOTE_ADDR="192.0.2.1")
    for n in range(2):
        assert not logged_in(log_in(client, f"typo-{n}"))
    assert logged_in(log_in(Client(REMOTE_ADDR="192.0.2.1"), RIGHT))
    assert not AdminLoginFailure.objects.exists()


VALIDATORS = [
    {"NAME": f"django.contrib.auth.password_validation.{name}"}
    for name in (
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    )
]


def test_createsuperuser_offers_no_bypass_of_the_validators(
    db: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the validators, and a person at a terminal who answers "y" to Django's
    # "Bypass password validation and create user anyway?"
    settings.AUTH_PASSWORD_VALIDATORS = VALIDATORS
    monkeypatch.setattr("getpass.getpass", lambda prompt="Password: ": "1")
    answers = iter(["olga", "olga@example.invalid", "y"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))

    class Terminal:
        def isatty(self) -> bool:
            return True

    # When they create a superuser with password "1"
    with pytest.raises(CommandError) as refused:
        call_command("createsuperuser", interactive=True, stdin=Terminal())
    # Then it is refused in one line, and nobody was created
    assert "This password is too short" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not User.objects.filter(username="olga").exists()


def production_createsuperuser(password: str) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("EFFECT_BROKER_", "DJANGO_"))
    }
    env.update(
        EFFECT_BROKER_ENV="production",
        DATABASE_URL=url_from_settings(connection.settings_dict),
        EFFECT_BROKER_MASTER_KEY=base64.b64encode(secrets.token_bytes(32)).decode(),
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="broker.example.com",
        DJANGO_SUPERUSER_PASSWORD=password,
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "effect_broker.cli",
            "createsuperuser",
            "--noinput",
            "--username",
            "olga",
            "--email",
            "olga@example.invalid",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.django_db(transaction=True)
def test_production_refuses_a_superuser_password_of_1() -> None:
    # When production's createsuperuser --noinput is given "1"
    weak = production_createsuperuser("1")
    # Then it exits 1 with one line naming the rule, and creates nobody
    assert weak.returncode == 1, weak.stdout + weak.stderr
    assert weak.stderr.strip().splitlines() == [
        "CommandError: This password is too short. It must contain at least 8 "
        "characters.; This password is too common.; This password is entirely numeric."
    ]
    assert not User.objects.filter(username="olga").exists()
    # And a password the validators accept creates the superuser
    strong = production_createsuperuser(RIGHT)
    assert strong.returncode == 0, strong.stdout + strong.stderr
    assert User.objects.get(username="olga").is_superuser
