"""The API's in-flight limit (effect_broker.api.admission.InFlightLimit), driven with a
fake ASGI application whose requests finish when the test says so."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from effect_broker.api.admission import InFlightLimit


class FakeApp:
    """An ASGI app whose every request waits for ``release`` and then answers 200."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.started.append(scope["path"])
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


class Response:
    """What the middleware sent for one request."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message["headers"]}
        else:
            self.body += message.get("body", b"")


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def request(limit: InFlightLimit, path: str = "/v1/effects") -> tuple[Response, Any]:
    response = Response()
    scope = {"type": "http", "path": path, "method": "POST"}
    task = asyncio.ensure_future(limit(scope, _receive, response.send))
    return response, task


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=10))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def assert_overloaded(response: Response) -> None:
    assert response.status == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["retry-after"] == "1"
    body = json.loads(response.body)
    assert body["code"] == "overloaded"
    assert body["status"] == 503
    assert body["reason"] == "in_flight_limit"
    assert int(response.headers["content-length"]) == len(response.body)


def test_requests_up_to_the_limit_run_at_once() -> None:
    async def scenario() -> None:
        app = FakeApp()
        limit = InFlightLimit(app, max_in_flight=3, max_queued=10, queue_timeout=5)
        calls = [request(limit) for _ in range(3)]
        await settle()
        assert len(app.started) == 3
        assert limit.in_flight == 3
        app.release.set()
        await asyncio.gather(*(task for _, task in calls))
        assert [r.status for r, _ in calls] == [200, 200, 200]
        assert limit.in_flight == 0

    run(scenario)


def test_over_the_limit_a_request_waits_and_then_runs() -> None:
    async def scenario() -> None:
        app = FakeApp()
        limit = InFlightLimit(app, max_in_flight=1, max_queued=10, queue_timeout=5)
        first, first_task = request(limit)
        second, second_task = request(limit)
        await settle()
        assert app.started == ["/v1/effects"]  # the second waits, not run yet
        assert limit.queued == 1
        app.release.set()
        await asyncio.gather(first_task, second_task)
        assert (first.status, second.status) == (200, 200)
        assert len(app.started) == 2
        assert (limit.in_flight, limit.queued) == (0, 0)

    run(scenario)


def test_a_request_that_waits_too_long_is_refused_with_503_and_never_runs() -> None:
    async def scenario() -> None:
        app = FakeApp()
        limit = InFlightLimit(app, max_in_flight=1, max_queued=10, queue_timeout=0.05)
        _, first_task = request(limit)
        second, second_task = request(limit)
        await second_task
        assert_overloaded(second)
        assert app.started == ["/v1/effects"]  # the refused request never reached it
        assert (limit.in_flight, limit.queued) == (1, 0)
        app.release.set()
        await first_task
        assert limit.in_flight == 0

    run(scenario)


def test_a_full_queue_refuses_at_once() -> None:
    async def scenario() -> None:
        app = FakeApp()
        limit = InFlightLimit(app, max_in_flight=1, max_queued=1, queue_timeout=5)
        _, first_task = request(limit)
        _, queued_task = request(limit)
        await settle()
        third, third_task = request(limit)
        await asyncio.wait_for(third_task, timeout=1)  # no 5 s wait
        assert_overloaded(third)
        app.release.set()
        await asyncio.gather(first_task, queued_task)
        assert len(app.started) == 2

    run(scenario)


def test_waiters_are_served_in_arrival_order() -> None:
    async def scenario() -> None:
        order: list[int] = []
        gate = asyncio.Event()

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            order.append(scope["n"])
            await gate.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        limit = InFlightLimit(app, max_in_flight=1, max_queued=10, queue_timeout=5)
        tasks = []
        for n in range(4):
            scope = {"type": "http", "path": "/v1/effects", "n": n}
            tasks.append(asyncio.ensure_future(limit(scope, _receive, Response().send)))
            await settle()
        gate.set()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]

    run(scenario)


def test_a_waiter_that_goes_away_does_not_take_a_slot_with_it() -> None:
    async def scenario() -> None:
        app = FakeApp()
        limit = InFlightLimit(app, max_in_flight=1, max_queued=10, queue_timeout=5)
        _, first_task = request(limit)
        _, gone_task = request(limit)
        third, third_task = request(limit)
        await settle()
        gone_task.cancel()
        await settle()
        app.release.set()
        await asyncio.gather(first_task, third_task)
        assert third.status == 200
        assert (limit.in_flight, limit.queued) == (0, 0)

    run(scenario)


def test_a_failing_request_frees_its_slot() -> None:
    async def scenario() -> None:
        async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
            raise RuntimeError("boom")

        limit = InFlightLimit(broken, max_in_flight=1, max_queued=0, queue_timeout=0)
        with pytest.raises(RuntimeError):
            await limit(
                {"type": "http", "path": "/v1/effects"}, _receive, Response().send
            )
        assert limit.in_flight == 0

    run(scenario)


def test_healthz_static_files_and_websockets_are_not_limited() -> None:
    async def scenario() -> None:
        app = FakeApp()
        limit = InFlightLimit(app, max_in_flight=1, max_queued=0, queue_timeout=0)
        _, busy = request(limit)
        health, health_task = request(limit, "/healthz")
        css, css_task = request(limit, "/static/admin/css/base.css")
        ready, ready_task = request(limit, "/readyz")
        await ready_task
        assert_overloaded(ready)  # readiness needs a connection like any request
        await settle()
        assert app.started == ["/v1/effects", "/healthz", "/static/admin/css/base.css"]
        app.release.set()
        await asyncio.gather(busy, health_task, css_task)
        assert health.status == 200
        assert css.status == 200

    run(scenario)


def test_the_effect_long_poll_is_not_limited_and_nothing_else_under_effects() -> None:
    # A long-poll waits up to 25 s holding no connection (issue 23): a slot held that
    # long per waiting agent would starve every other route
    async def scenario() -> None:
        app = FakeApp()
        limit = InFlightLimit(app, max_in_flight=1, max_queued=0, queue_timeout=0)
        _, busy = request(limit)
        poll, poll_task = request(limit, "/v1/effects/0b6f3c1e/wait")
        refused = [
            request(limit, path)
            for path in (
                "/v1/effects/0b6f3c1e",
                "/v1/effects/0b6f3c1e/history",
                "/v1/effects/0b6f3c1e/wait/more",
                "/v1/effects/a/b/wait",
            )
        ]
        await asyncio.gather(*(task for _, task in refused))
        for response, _ in refused:
            assert_overloaded(response)
        await settle()
        assert app.started == ["/v1/effects", "/v1/effects/0b6f3c1e/wait"]
        app.release.set()
        await asyncio.gather(busy, poll_task)
        assert poll.status == 200

    run(scenario)


def test_lifespan_is_answered_and_runs_the_shutdown_hook() -> None:
    async def scenario() -> None:
        closed: list[bool] = []
        limit = InFlightLimit(
            FakeApp(),
            max_in_flight=1,
            max_queued=0,
            queue_timeout=0,
            on_shutdown=lambda: closed.append(True),
        )
        inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        sent: list[str] = []

        async def receive() -> dict[str, Any]:
            return inbox.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message["type"])

        await limit({"type": "lifespan"}, receive, send)
        assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
        assert closed == [True]

    run(scenario)


def test_the_limit_must_admit_at_least_one_request() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        InFlightLimit(FakeApp(), max_in_flight=0, max_queued=0, queue_timeout=0)
