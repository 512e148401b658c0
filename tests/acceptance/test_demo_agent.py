"""``effect-broker demo agent`` as a user runs it (issue 10, items 7 and 8): the scripted
agent's charge, delivered three times over a real MCP stdio session while a real
worker process is SIGKILLed after the target committed, leaves exactly one charge in
the target's own table - read here with our own SQL, not from the demo's output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow]


def run_demo(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    # The user's environment minus broker settings; DATABASE_URL stays if set, so the
    # demo runs where the rest of the suite runs (embedded PostgreSQL otherwise).
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "effect_broker.cli", "demo", "agent", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def drop(url: str) -> None:
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_scripted_agent_under_a_worker_kill_leaves_exactly_one_target_charge() -> (
    None
):
    # When the demo runs (keeping its scratch database so we can look ourselves)
    result = run_demo("--keep-database")
    out = result.stdout
    kept = re.search(r"^kept database: (\S+)$", out, flags=re.MULTILINE)
    try:
        # Then it exits 0 with the count and the verdict, and no traceback anywhere
        assert result.returncode == 0, out + result.stderr
        assert "TARGET CHARGE COUNT: 1" in out
        assert "verdict: PASS" in out
        assert "Traceback" not in out + result.stderr
        # the call really was delivered three times and the worker really was killed
        assert out.count("delivery ") == 3
        assert re.search(r"delivery [123]/3: succeeded", out)
        assert "SIGKILLed at after_target_commit" in out
        assert "replacement worker w2" in out
        # and the receipt is printed
        assert '"receipt_id"' in out
        assert kept is not None, out

        # And the target's own table, read directly, holds exactly one charge, made
        # under the downstream key the demo reports
        with psycopg.connect(kept.group(1), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT id, mode, idempotency_key FROM agent_demo_target.charges"
            ).fetchall()
            intents = conn.execute("SELECT count(*) FROM effect_intents").fetchone()
        assert len(rows) == 1
        charge_id, mode, key = rows[0]
        assert mode == "idempotent"
        assert f"under this effect's Idempotency-Key {key}" in out
        assert f'"external_id": "{charge_id}"' in out
        # the three deliveries were one intent in the broker's ledger
        assert intents == (1,)
    finally:
        if kept is not None:
            drop(kept.group(1))


class ChatCompletions(BaseHTTPRequestHandler):
    """A stand-in for an OpenAI-compatible model endpoint: it answers like a model
    that charges, reads the receipt, then answers - from what the request carries."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/chat/completions"
        assert {t["function"]["name"] for t in body["tools"]} >= {"charge_order"}
        answers = [m for m in body["messages"] if m["role"] == "tool"]
        message: dict[str, object] = {"role": "assistant", "content": None}
        if not answers:
            arguments = {"order": "42", "amount_minor": 1999, "currency": "EUR"}
            message["tool_calls"] = [call("call_live_1", "charge_order", arguments)]
        elif len(answers) == 1:
            effect_id = json.loads(answers[0]["content"])["effect_id"]
            message["tool_calls"] = [
                call("call_live_2", "get_receipt", {"effect_id": effect_id})
            ]
        else:
            message["content"] = "Charged."
        payload = json.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        pass


def call(call_id: str, name: str, arguments: dict[str, object]) -> dict[str, object]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_the_openai_provider_runs_the_same_demo_through_the_openai_sdk() -> None:
    # Given an OpenAI-compatible endpoint on this machine (the SDK honours
    # OPENAI_BASE_URL), so the live provider's wiring runs without a billed call
    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), ChatCompletions)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    try:
        # When the demo runs with --provider openai
        result = run_demo(
            "--provider",
            "openai",
            "--model",
            "stand-in",
            OPENAI_API_KEY="sk-stand-in",
            OPENAI_BASE_URL=f"http://127.0.0.1:{endpoint.server_port}/v1",
        )
    finally:
        endpoint.shutdown()
        endpoint.server_close()

    # Then the model's own call id keys the charge, and the target holds one charge
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "[5/7] agent (openai model)" in out
    assert "tool-call id 'call_live_1'" in out
    assert "SIGKILLed at after_target_commit" in out
    assert "TARGET CHARGE COUNT: 1" in out
    assert "model (openai): Charged." in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--deliveries", "0"], "--deliveries must be between 1 and 10"),
        (["--provider", "grok"], "grok: set XAI_API_KEY to an API key"),
        (["--model", "x"], "--model applies to --provider openai or grok"),
    ],
)
def test_bad_options_are_one_line_and_exit_2_before_anything_starts(
    args: list[str], message: str
) -> None:
    result = run_demo(*args, XAI_API_KEY="")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"effect-broker: error [invalid_request]: {message}"
    ]
    assert result.stdout == ""  # refused before anything was started
