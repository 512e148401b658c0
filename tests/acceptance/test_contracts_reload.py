"""When a change to the contracts file takes effect: at the next start of each process.

Issue 20: nowhere did it say. A process reads the contracts file once, at start, and
keeps that registry for its life (a submit is pinned to the version it validated
against, so a registry that changed under a running request would be a race). The
story is restart, stated in docs/how-to/contracts.md; this test holds the API to it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_api_server import Scratch, Server, scratch  # noqa: F401

pytestmark = pytest.mark.slow

ONE = """
[[contract]]
name = "pay.charge"
version = "1"
tool = "charge_card"
safety = "unsafe"
retry_limit = 3
adapter = "simulated"
"""
TWO = (
    ONE
    + """
[[contract]]
name = "pay.refund"
version = "1"
tool = "refund_card"
safety = "unsafe"
retry_limit = 3
adapter = "simulated"
"""
)


def submit_refund(server: Server, key: str, n: int) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/effects",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "operation_key": f"order:{n}:refund",
            "tool": "refund_card",
            "arguments": {},
        },
        timeout=10,
    )


def test_a_changed_contracts_file_takes_effect_at_the_next_start(
    scratch: Scratch,  # noqa: F811
    tmp_path: Path,
) -> None:
    # Given an API started with a contracts file that has no refund tool
    contracts = tmp_path / "contracts.toml"
    contracts.write_text(ONE, encoding="utf-8")
    settings = {"EFFECT_BROKER_CONTRACTS": str(contracts)}
    server = Server(scratch, "reload-1", settings)
    try:
        assert submit_refund(server, scratch.api_key, 1).json()["code"] == (
            "unknown_contract"
        )
        # When the file gains the tool while the process runs
        contracts.write_text(TWO, encoding="utf-8")
        # Then the running process still answers from what it read at start
        still = submit_refund(server, scratch.api_key, 2)
        assert (still.status_code, still.json()["code"]) == (422, "unknown_contract")
    finally:
        server.stop()
    # And a restarted process serves the new file
    restarted = Server(scratch, "reload-2", settings)
    try:
        accepted = submit_refund(restarted, scratch.api_key, 3)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json()["contract"].startswith("pay.refund")
    finally:
        restarted.stop()
