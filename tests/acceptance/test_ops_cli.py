"""The operations commands as a user runs them: ``contracts validate``, ``tenants``,
``serve`` (real subprocesses of the ``effect-broker`` console script)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from config.database import url_from_settings
from effect_broker.domain.contracts import load_contracts

ROOT = Path(__file__).resolve().parents[2]

BROKEN = """\
[[contract]]
name = "pay"
version = "1"
safety = "idempotent"

[[contract]]
name = "refund"
version = "1"
safety = "unsafe"
retry_limt = 3

[[contract]]
name = "ship"
version = "1"
safety = "unsafe"
adapter = "http"
[contract.adapter_options]
method = "POST"
"""


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- contracts validate -----------------------------------------------------------


def test_validate_names_every_problem_as_file_contract_field(tmp_path: Path) -> None:
    path = tmp_path / "contracts.toml"
    path.write_text(BROKEN, encoding="utf-8")
    result = run("contracts", "validate", str(path))
    assert result.returncode == 1
    problems = [line for line in result.stderr.splitlines() if line.startswith(str(path))]
    assert problems[0] == (
        f"{path}:pay@1:key_retention: required for safety class idempotent"
    )
    assert problems[1].startswith(
        f"{path}:refund@1:retry_limt: unknown key; did you mean 'retry_limit'? (allowed: "
    )
    assert problems[2] == f"{path}:ship@1:adapter_options.url: must be a non-empty string"
    assert "3 problem(s)" in problems[3]
    assert "Traceback" not in result.stderr
    as_json = run("contracts", "validate", str(path), "--json")
    assert as_json.returncode == 1
    body = json.loads(as_json.stdout)
    assert body["ok"] is False
    assert [(p["contract"], p["field"]) for p in body["problems"]] == [
        ("pay@1", "key_retention"),
        ("refund@1", "retry_limt"),
        ("ship@1", "adapter_options.url"),
    ]


def test_validate_accepts_the_shipped_example_and_a_missing_file_is_one_line() -> None:
    example = ROOT / "examples" / "contracts.toml"
    good = run("contracts", "validate", str(example))
    assert good.returncode == 0, good.stderr
    assert f"{len(load_contracts(example))} contract(s) valid" in good.stdout
    missing = run("contracts", "validate", "/nonexistent/contracts.toml")
    assert missing.returncode == 1
    assert missing.stderr.splitlines()[0].startswith(
        "/nonexistent/contracts.toml:-:-: cannot read contracts file:"
    )


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def _answer(self) -> None:
        self.seen.append((self.command, self.path))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recording_target() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    seen: list[tuple[str, str]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_probe_checks_each_target_answers_and_sends_no_effect(
    tmp_path: Path, recording_target: tuple[str, list[tuple[str, str]]]
) -> None:
    url, seen = recording_target
    closed = free_port()
    path = tmp_path / "contracts.toml"
    path.write_text(
        f"""
[[contract]]
name = "up"
version = "1"
safety = "unsafe"
adapter = "http"
[contract.adapter_options]
url = "{url}/charges/{{effect_id}}"

[[contract]]
name = "down"
version = "1"
safety = "unsafe"
adapter = "http"
[contract.adapter_options]
url = "http://127.0.0.1:{closed}/charges"

[[contract]]
name = "rec"
version = "1"
safety = "reconcilable"
settlement_bound = "1s"
adapter = "http"
[contract.adapter_options]
url = "{url}/charges"
correlation_header = "X-Correlation-Key"
probe_url = "http://127.0.0.1:{closed}/charges?key={{downstream_key}}"

[[contract]]
name = "mcp-http"
version = "1"
safety = "unsafe"
adapter = "mcp"
[contract.upstream]
url = "{url}/mcp"
tool = "charge"

[[contract]]
name = "mcp-stdio"
version = "1"
safety = "unsafe"
adapter = "mcp"
[contract.upstream]
command = "no-such-mcp-server-{closed}"
tool = "charge"

[[contract]]
name = "sim"
version = "1"
safety = "unsafe"
""",
        encoding="utf-8",
    )
    result = run("contracts", "validate", str(path), "--probe", "--json")
    assert result.returncode == 1, result.stderr
    probes = {p["contract"]: p for p in json.loads(result.stdout)["probes"]}
    assert probes["up@1"]["state"] == "ok"
    assert probes["up@1"]["detail"] == f"HEAD {url}/ answered HTTP 404"
    assert probes["down@1"]["state"] == "failed"
    assert "ConnectError" in probes["down@1"]["detail"]
    assert probes["sim@1"]["state"] == "ok"
    # A lookup on another host is asked too: its target is down.
    assert probes["rec@1"]["state"] == "failed"
    assert f"HEAD http://127.0.0.1:{closed}/" in probes["rec@1"]["detail"]
    # An MCP server: over HTTP its base URL is asked; over stdio it is only looked up.
    assert probes["mcp-http@1"]["state"] == "ok"
    assert probes["mcp-stdio@1"]["state"] == "failed"
    assert "not found on PATH" in probes["mcp-stdio@1"]["detail"]
    # The target saw one HEAD of its base URL per contract, never a path or a POST.
    assert seen == [("HEAD", "/")] * 3


def test_doctor_with_no_database_fails_in_one_line_per_check() -> None:
    result = run("doctor", env={"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"})
    assert result.returncode == 1
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[1:11]}
    assert rows["database"] == "FAIL"
    assert rows["migrations"] == rows["workers"] == "skip"
    assert rows["contracts"] == "ok"
    assert "Traceback" not in result.stdout + result.stderr


# --- tenants ----------------------------------------------------------------------


def test_help_and_json_for_every_operations_command() -> None:
    for command in (
        ("serve",),
        ("doctor",),
        ("contracts", "validate"),
        ("tenants",),
        ("tenants", "create"),
        ("tenants", "rotate-key"),
    ):
        result = run(*command, "--help")
        assert result.returncode == 0, (command, result.stderr)
        assert "usage: effect-broker" in result.stdout
    for command in (("doctor",), ("contracts", "validate"), ("tenants", "list")):
        assert "--json" in run(*command, "--help").stdout


@pytest.mark.django_db(transaction=True)
def test_tenant_lifecycle_from_the_cli_is_what_the_api_enforces() -> None:
    connection.ensure_connection()
    env = {"DATABASE_URL": url_from_settings(connection.settings_dict)}
    client = Client()

    def submit(key: str) -> int:
        body = {
            "operation_key": f"order:{time.monotonic_ns()}:charge",
            "tool": "charge_card",
            "arguments": {"amount_minor": 100},
        }
        response = client.post(
            "/v1/effects",
            data=json.dumps(body),
            content_type="application/json",
            headers={"authorization": f"Bearer {key}"},
        )
        return response.status_code

    created = run("tenants", "--json", "create", "acme-cli", env=env)
    assert created.returncode == 0, created.stderr
    tenant = json.loads(created.stdout)
    first_key = tenant["api_key"]
    assert tenant["state"] == "enabled"
    assert submit(first_key) == 202
    # The key is shown once: list never prints it.
    listed = run("tenants", "list", "--json", env=env)
    assert [t["name"] for t in json.loads(listed.stdout)] == ["acme-cli"]
    assert first_key not in listed.stdout
    duplicate = run("tenants", "create", "acme-cli", env=env)
    assert duplicate.returncode == 2
    assert duplicate.stderr.strip() == (
        "effect-broker: error [invalid_request]: a tenant named 'acme-cli' already exists"
    )
    # Disabled: the API refuses the key with a 403 problem, then accepts it again.
    assert run("tenants", "disable", "acme-cli", env=env).returncode == 0
    refused = client.get("/v1/effects", headers={"authorization": f"Bearer {first_key}"})
    assert refused.status_code == 403
    assert refused.json()["code"] == "tenant_disabled"
    assert submit(first_key) == 403
    assert run("tenants", "enable", tenant["id"], env=env).returncode == 0
    assert submit(first_key) == 202
    # Rotated: the old key stops working at once, the new one works.
    rotated = run("tenants", "rotate-key", "acme-cli", env=env)
    assert rotated.returncode == 0
    new_key = rotated.stdout.split("api key (shown once): ")[1].strip()
    assert new_key != first_key
    assert submit(first_key) == 401
    assert submit(new_key) == 202
    unknown = run("tenants", "disable", "nobody", env=env)
    assert unknown.returncode == 2
    assert "tenant_not_found" in unknown.stderr


# --- serve ------------------------------------------------------------------------


def test_serve_answers_serves_admin_css_and_stops_gracefully_on_sigterm(
    tmp_path: Path,
) -> None:
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    # DEBUG off: static files come only from collectstatic's output, as in production.
    static_root = tmp_path / "static"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "effect_broker.cli",
            "serve",
            "--port",
            str(port),
            "--collectstatic",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "DEBUG": "0",
            "EFFECT_BROKER_STATIC_ROOT": str(static_root),
        },
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"{base}/healthz", trust_env=False)
                break
            except httpx.TransportError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        (tmp_path / "serve.log").read_text(errors="replace")
                    ) from None
                time.sleep(0.2)
        assert health.json() == {"status": "ok"}
        static = settings.STATIC_URL.strip("/")
        css = httpx.get(f"{base}/{static}/admin/css/base.css", trust_env=False)
        assert css.status_code == 200
        assert css.headers["content-type"].startswith("text/css")
        assert (static_root / "admin" / "css" / "base.css").is_file()
        assert "server" not in health.headers
        # The served process replaced the command (exec): the signal reaches uvicorn.
        server.send_signal(signal.SIGTERM)
        # uvicorn finishes its graceful shutdown, then re-raises the signal it caught
        # (so a supervisor sees "stopped by SIGTERM"); the log proves the shutdown ran.
        assert server.wait(timeout=30) == -signal.SIGTERM
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        log.close()
    text = (tmp_path / "serve.log").read_text(errors="replace")
    assert "Application shutdown complete" in text
    assert "Traceback" not in text
