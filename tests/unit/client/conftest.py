"""Fakes for the SDK's unit tests: the broker's JSON, a scripted HTTP broker on
``httpx.MockTransport``, and a clock that only moves when the client sleeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

EFFECT_ID = "0b6f3c1e-5a0e-4a7e-9a57-1f3a3c1c2d4e"
NOW = "2026-12-03T21:00:00Z"


def effect_json(
    status: str = "prepared", safety: str = "idempotent", **changes: Any
) -> dict[str, Any]:
    """An effect as GET /v1/effects/{id} answers it."""
    return {
        "effect_id": EFFECT_ID,
        "operation_key": "order:42:charge:v1",
        "tool": "charge_card",
        "contract": "payments.charge@1",
        "safety_class": safety,
        "status": status,
        "version": 1,
        "attempt_count": 0,
        "arguments_preview": {"order": "42"},
        "receipt_id": None,
        "created_at": NOW,
        "updated_at": NOW,
        **changes,
    }


def receipt_json(result: dict[str, Any]) -> dict[str, Any]:
    """A receipt as GET /v1/effects/{id}/receipt answers it."""
    return {
        "receipt_id": "r1",
        "effect_id": EFFECT_ID,
        "external_id": "ch_1",
        "result": result,
        "result_preview": {},
        "evidence_digest": "d",
        "target_timestamp": None,
        "contract_version": "1",
        "downstream_key_digest": "k",
        "created_at": NOW,
    }


def problem(
    status: int, code: str, detail: str = "refused", **extra: Any
) -> httpx.Response:
    """An application/problem+json answer, as effect_broker.api.problems builds it."""
    body = {"type": f"x/{code}", "title": code, "status": status, "code": code}
    return httpx.Response(
        status,
        json={**body, "detail": detail, **extra},
        headers={"Content-Type": "application/problem+json"},
    )


Answer = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


@dataclass
class ScriptedBroker:
    """Answers requests from a script, in order, and records what it was sent."""

    script: list[Answer] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if not self.script:
            raise AssertionError(f"unscripted request {request.method} {request.url}")
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(request)
        return answer


@dataclass
class FakeClock:
    """Monotonic time that moves only when the code under test sleeps."""

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker() -> ScriptedBroker:
    return ScriptedBroker()
