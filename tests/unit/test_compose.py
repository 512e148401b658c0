"""docker-compose.yml describes a stack that would work (issue 11, item 8).

No Docker engine runs where this project is developed or tested, so nothing here
starts a container; what can be checked without one is checked: the services exist,
the API and workers wait for a migration that must succeed, each long-running service
has a health check of its own that probes its own port, a restart policy that never
mistakes an exit for success, the database keeps its data in a volume, and every
command a service runs exists in this project, with the options it passes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from effect_broker import embedded_pg
from effect_broker.domain.contracts import load_contracts
from tests.unit.command_lines import check_command, check_line

ROOT = Path(__file__).resolve().parents[2]
LONG_RUNNING = ("api", "worker", "reconciler", "target")


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def services() -> dict[str, Any]:
    return compose()["services"]


def test_the_stack_has_every_service_a_working_system_needs() -> None:
    assert set(services()) >= {"postgres", "migrate", *LONG_RUNNING}


def test_postgres_keeps_its_data_in_a_named_volume() -> None:
    volumes = services()["postgres"]["volumes"]
    # PostgreSQL 18's images keep their data under /var/lib/postgresql/<major>/
    assert any(v.endswith(":/var/lib/postgresql") for v in volumes)
    named = volumes[0].split(":")[0]
    assert named in compose()["volumes"]


@pytest.mark.parametrize("name", ["api", "worker", "reconciler"])
def test_the_broker_waits_for_a_migration_that_succeeded(name: str) -> None:
    depends = services()[name]["depends_on"]
    assert depends["migrate"]["condition"] == "service_completed_successfully"
    assert services()["migrate"]["depends_on"]["postgres"]["condition"] == (
        "service_healthy"
    )
    assert services()["migrate"]["restart"] == "no"


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_each_service_checks_its_own_health_on_its_own_port(name: str) -> None:
    check = " ".join(services()[name]["healthcheck"]["test"])
    own_ports = {
        # Readiness, not liveness: it fails when the pool lends no connection
        # (issue 19: a drained pool made every call a 503 while /healthz said 200).
        "api": "8000/readyz",
        "worker": "9101/metrics",
        "reconciler": "9102/metrics",
        "target": "8081/stats",
    }
    assert own_ports[name] in check
    # The worker must not inherit the API's check (issue 11: it probed port 8000).
    others = {p for n, p in own_ports.items() if n != name}
    assert not any(port in check for port in others)


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_an_exit_is_restarted_never_taken_for_success(name: str) -> None:
    assert services()[name]["restart"] == "unless-stopped"


@pytest.mark.parametrize("name", ["worker", "reconciler"])
def test_a_worker_serves_the_metrics_port_its_health_check_probes(name: str) -> None:
    env = services()[name]["environment"]
    port = env["EFFECT_BROKER_WORKER_METRICS_PORT"]
    assert port in " ".join(services()[name]["healthcheck"]["test"])
    assert env["EFFECT_BROKER_WORKER_METRICS_ADDR"] == "0.0.0.0"  # noqa: S104


@pytest.mark.parametrize("name", [*LONG_RUNNING, "migrate"])
def test_every_command_a_service_runs_exists(name: str) -> None:
    command = list(services()[name]["command"])
    if command[:2] == ["sh", "-c"]:
        check_line(command[2])
    else:
        check_command(command)


def _user(url: str) -> str:
    return url.split("://", 1)[1].split(":", 1)[0]


def test_the_owner_migrates_and_the_services_serve_as_the_granted_role() -> None:
    # docs/fencing.md: the triggers bind every role but the tables' owner
    migrate = services()["migrate"]
    assert _user(migrate["environment"]["DATABASE_URL"]) == "broker_owner"
    assert "effect-broker db grant --role broker_app" in migrate["command"][2]
    for name in ("api", "worker", "reconciler"):
        env = services()[name]["environment"]
        assert _user(env["DATABASE_URL"]) == "broker_app", name
    roles = (ROOT / "examples" / "compose" / "initdb" / "roles.sql").read_text()
    assert "CREATE ROLE broker_owner LOGIN" in roles
    assert "CREATE ROLE broker_app LOGIN" in roles
    assert "CREATE DATABASE effect_broker OWNER broker_owner" in roles
    mounts = services()["postgres"]["volumes"]
    assert "./examples/compose/initdb:/docker-entrypoint-initdb.d:ro" in mounts


def test_images_are_pinned_and_postgres_is_the_embedded_servers_version() -> None:
    image = services()["postgres"]["image"]
    found = re.fullmatch(r"postgres:(\d+\.\d+)-alpine", image)
    assert found, image
    binary = embedded_pg._find_install() / "bin" / "postgres"
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert f"(PostgreSQL) {found.group(1)}\n" in version, version
    dockerfile = (ROOT / "Dockerfile").read_text()
    bases = re.findall(r"^FROM (\S+)", dockerfile, flags=re.M)
    assert bases
    assert all(re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", b) for b in bases), bases


def test_the_master_key_comes_from_a_secret_file_not_the_environment() -> None:
    for name in ("migrate", "api", "worker", "reconciler"):
        env = services()[name]["environment"]
        assert "EFFECT_BROKER_MASTER_KEY" not in env, name
        assert env["EFFECT_BROKER_MASTER_KEY_FILE"] == "/run/secrets/master_key"
        assert services()[name]["secrets"] == ["master_key"], name
    assert compose()["secrets"]["master_key"]["file"] == "./secrets/master_key"


def test_the_mounted_contracts_load_and_point_at_the_target_service() -> None:
    registry = load_contracts(ROOT / "examples" / "compose" / "contracts.toml")
    urls = [c.adapter_options["url"] for c in registry]
    assert urls
    assert all(url.startswith("http://target:8081/") for url in urls)


def test_the_image_runs_as_a_non_root_user_in_stages() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.count("FROM ") >= 2
    users = [
        line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")
    ]
    assert users
    assert users[-1] not in {"root", "0"}


def test_the_image_health_checks_readiness_which_fails_on_a_drained_pool() -> None:
    # Issue 19: the image probed /healthz, which stayed 200 while a leak had drained
    # the pool and every request was a 503; /readyz borrows a connection.
    dockerfile = (ROOT / "Dockerfile").read_text()
    check = dockerfile.split("HEALTHCHECK", 1)[1].split("\nCMD [", 1)[0]
    assert "http://127.0.0.1:8000/readyz" in check
    assert "/healthz" not in check
