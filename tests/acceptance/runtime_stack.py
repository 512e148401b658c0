"""A running broker for the runtime recipes' tests: a migrated scratch database, the
crash matrix's payment target, the API, one worker, a tenant and an operator, and a
second database for the runtimes' own state (DBOS, LangGraph, Celery)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from config.database import url_from_settings
from examples.crash_matrix.contracts import write_contracts
from examples.crash_matrix.runtime_support import (
    Program,
    python_module,
    scratch_workdir,
    start_api,
)
from examples.crash_matrix.target_client import TargetProcess, start_target
from examples.crash_matrix.workers import ROOT, WorkerProcess, broker_env

#: Migrate, make the tenant and the operator ``olga`` (staff, may resolve effects).
SETUP = """
import json
from django.core.management import call_command
call_command("migrate", verbosity=0, interactive=False)
from django.contrib.auth.models import Permission, User
from effect_broker.services.tenants import create_tenant
olga = User.objects.create_user("olga", is_staff=True)
olga.user_permissions.add(Permission.objects.get(codename="resolve_effect"))
print(json.dumps({"api_key": create_tenant("shop")[1]}))
"""


@dataclass
class Stack:
    """What a recipe needs to run against a live broker."""

    api_url: str
    api_key: str
    runtime_database_url: str
    broker_env: dict[str, str]
    target: TargetProcess
    workdir: Path

    def recipe_env(self, **extra: str) -> dict[str, str]:
        """The environment a user exports before running a recipe."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("EFFECT_BROKER_", "DATABASE_URL"))
        }
        env.update(
            {
                "EFFECT_BROKER_URL": self.api_url,
                "EFFECT_BROKER_API_KEY": self.api_key,
                "RUNTIME_DATABASE_URL": self.runtime_database_url,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra)
        return env

    def start(self, name: str, module: str, *args: str, **env: str) -> Program:
        """Start a recipe (``python -m module args``) as printed in its docstring."""
        return python_module(
            name, module, list(args), self.recipe_env(**env), self.workdir
        )

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``effect-broker ARGS`` on the stack's database (an operator's terminal)."""
        return subprocess.run(
            [sys.executable, "-m", "effect_broker.cli", *args],
            cwd=ROOT,
            env=self.broker_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def charges(self, order: str) -> int:
        """Charges for ``order`` in the target's own table."""
        body = {"order": order, "amount_minor": 1999, "currency": "EUR"}
        return self.target.count_by_body(body)


def _create(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def _drop(admin_url: str, *names: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def live_stack() -> Iterator[Stack]:
    """Start everything; stop it and drop both databases afterwards."""
    connection.ensure_connection()
    admin_url = url_from_settings(connection.settings_dict)
    name = f"eb_runtimes_{uuid.uuid4().hex[:8]}"
    names = (name, f"{name}_state")
    _create(admin_url, name)
    _create(admin_url, names[1])
    workdir = scratch_workdir("eb-runtimes-")
    database_url = url_from_settings(connection.settings_dict, dbname=name)
    started: list[Any] = []
    try:
        target = start_target(database_url, settlement_delay="500ms", schema="shop")
        started.append(target)
        contracts = write_contracts(workdir / "contracts.toml", target.url)
        env = broker_env(database_url, contracts, settings.EFFECT_BROKER_MASTER_KEY)
        setup = subprocess.run(
            [sys.executable, "-m", "effect_broker.cli", "shell", "-c", SETUP],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if setup.returncode != 0:
            raise RuntimeError(f"setup failed:\n{setup.stderr[-2000:]}")
        api_key = json.loads(setup.stdout.strip().splitlines()[-1])["api_key"]
        started.append(WorkerProcess("runtimes", env))
        api, api_url = start_api(env, workdir)
        started.append(api)
        yield Stack(
            api_url=api_url,
            api_key=api_key,
            runtime_database_url=url_from_settings(
                connection.settings_dict, dbname=names[1]
            ),
            broker_env=env,
            target=target,
            workdir=workdir,
        )
    finally:
        for process in reversed(started):
            # Nothing to finish gracefully: the databases are dropped next.
            process.kill()
            if isinstance(process, WorkerProcess):
                process.close()
        _drop(admin_url, *names)
