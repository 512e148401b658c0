"""The body-size limit (effect_broker.api.body_limit.BodySizeLimit), driven with a
fake ASGI application that reads the body as Django does: all of it, first."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from effect_broker.api.body_limit import BodySizeLimit

LIMIT = 1000


class ReadingApp:
    """Reads the whole body, then answers 200 with its length."""

    def __init__(self) -> None:
        self.called = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.called = True
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})


class Upload:
    """A client sending ``chunks`` of ``size`` bytes, counting what was read."""

    def __init__(self, chunks: int, size: int) -> None:
        self.left, self.size, self.read = chunks, size, 0

    async def receive(self) -> dict[str, Any]:
        if self.left == 0:
            return {"type": "http.disconnect"}
        self.left -= 1
        self.read += self.size
        return {
            "type": "http.request",
            "body": b"x" * self.size,
            "more_body": self.left > 0,
        }


def call(
    app: ReadingApp, upload: Upload, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[int, dict[str, str], bytes]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "path": "/v1/effects",
        "method": "POST",
        "headers": headers or [],
    }
    asyncio.run(BodySizeLimit(app, max_body_bytes=LIMIT)(scope, upload.receive, send))
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


def test_a_declared_length_over_the_limit_is_refused_without_reading_a_byte() -> None:
    app, upload = ReadingApp(), Upload(chunks=300, size=1 << 20)
    status, headers, body = call(
        app, upload, [(b"content-length", str(300 << 20).encode())]
    )
    assert status == 413
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    problem = json.loads(body)
    assert (problem["code"], problem["status"], problem["limit"]) == (
        "payload_too_large",
        413,
        LIMIT,
    )
    assert upload.read == 0
    assert app.called is False


def test_a_chunked_body_is_refused_once_the_count_passes_the_limit() -> None:
    app, upload = ReadingApp(), Upload(chunks=10_000, size=300)
    status, _, body = call(app, upload)
    assert status == 413
    assert json.loads(body)["code"] == "payload_too_large"
    assert upload.read == 1200  # four receives: the first past 1000 bytes
    assert upload.left == 10_000 - 4


@pytest.mark.parametrize(("chunks", "size"), [(1, LIMIT), (4, 250), (0, 0)])
def test_a_body_at_or_under_the_limit_reaches_the_application(
    chunks: int, size: int
) -> None:
    app = ReadingApp()
    status, _, body = call(app, Upload(chunks=chunks, size=size))
    assert (status, body) == (200, str(chunks * size).encode())


def test_other_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def nothing() -> dict[str, Any]:
        return {}

    async def drop(message: dict[str, Any]) -> None:
        return None

    limit = BodySizeLimit(app, max_body_bytes=LIMIT)
    asyncio.run(limit({"type": "lifespan"}, nothing, drop))
    assert seen == ["lifespan"]


# --- framing and time (issue 19) --------------------------------------------------


class Trickle:
    """A client sending one byte every ``interval`` seconds, ``total`` in all."""

    def __init__(self, interval: float, total: int = 1_000_000) -> None:
        self.interval, self.left, self.read = interval, total, 0

    async def receive(self) -> dict[str, Any]:
        await asyncio.sleep(self.interval)
        self.left -= 1
        self.read += 1
        return {"type": "http.request", "body": b"x", "more_body": self.left > 0}


class RecordingApp(ReadingApp):
    """``ReadingApp`` that notes when it was called and what it had read by then."""

    def __init__(self, upload: Trickle) -> None:
        super().__init__()
        self.upload = upload
        self.read_when_called = -1

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.read_when_called = self.upload.read
        await super().__call__(scope, receive, send)


def call_limited(
    app: Any,
    receive: Any,
    headers: list[tuple[bytes, bytes]] | None = None,
    **limits: float,
) -> tuple[int, dict[str, str], bytes, float]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/v1/effects", "method": "POST"}
    scope["headers"] = headers or []
    middleware = BodySizeLimit(app, max_body_bytes=LIMIT, **limits)
    started = time.monotonic()
    asyncio.run(middleware(scope, receive, send))
    elapsed = time.monotonic() - started
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    headers_out = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers_out, body, elapsed


def test_a_body_slower_than_the_minimum_rate_is_408_once_it_falls_behind() -> None:
    # Given a client trickling a byte every 0.1 s (10 B/s) where 100 B/s are required
    # after a 0.3 s head start
    upload = Trickle(0.1)
    app = ReadingApp()
    # When it sends
    status, headers, body, elapsed = call_limited(
        app, upload.receive, read_timeout=30, min_rate=100, grace=0.3
    )
    # Then it is refused as soon as it falls behind, and the application never ran
    assert status == 408
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    problem = json.loads(body)
    assert (problem["code"], problem["status"]) == ("request_timeout", 408)
    assert problem["detail"] == (
        "request body too slow: it must arrive within 30 s, at 100 bytes per second "
        "or faster after the first 0.3 s"
    )
    assert app.called is False
    # 0.3 s plus 0.01 s per byte received: caught up with after 3-4 bytes
    assert 0.3 <= elapsed < 1.5, elapsed
    assert upload.read < 10


def test_a_body_within_the_rate_but_over_the_total_time_is_408() -> None:
    # Given a client fast enough for the rate (20 B/s, 1 required) but not the total
    upload = Trickle(0.05)
    app = ReadingApp()
    status, _, body, elapsed = call_limited(
        app, upload.receive, read_timeout=0.5, min_rate=1, grace=0.1
    )
    assert status == 408
    assert json.loads(body)["code"] == "request_timeout"
    assert app.called is False
    assert 0.5 <= elapsed < 1.5, elapsed


def test_the_application_runs_only_once_the_whole_body_has_arrived() -> None:
    # Given a body of 5 bytes trickled within the limits
    upload = Trickle(0.02, total=5)
    app = RecordingApp(upload)
    status, _, body, _ = call_limited(
        app, upload.receive, read_timeout=5, min_rate=1, grace=1
    )
    # Then the application (the in-flight limit, in config/asgi.py) was called only
    # after the last byte, and still reads the body whole
    assert app.read_when_called == 5
    assert (status, body) == (200, b"5")


def test_a_disconnect_after_the_body_still_reaches_the_application() -> None:
    # Django listens for the client's disconnect after the body: it must hear it.
    messages = [
        {"type": "http.request", "body": b"ab", "more_body": False},
        {"type": "http.disconnect"},
    ]
    heard: list[str] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        heard.append((await receive())["type"])
        heard.append((await receive())["type"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    status, _, _, _ = call_limited(app, receive)
    assert status == 204
    assert heard == ["http.request", "http.disconnect"]


@pytest.mark.parametrize(
    "headers",
    [
        [(b"content-length", b"5"), (b"transfer-encoding", b"chunked")],
        [(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"0")],
    ],
)
def test_content_length_with_transfer_encoding_is_400_and_closes(
    headers: list[tuple[bytes, bytes]],
) -> None:
    upload = Upload(chunks=1, size=5)
    app = ReadingApp()
    status, headers_out, body, _ = call_limited(app, upload.receive, headers)
    assert status == 400
    assert headers_out["connection"] == "close"
    problem = json.loads(body)
    assert problem["code"] == "invalid_request"
    assert problem["detail"] == (
        "a request must not carry both Content-Length and Transfer-Encoding"
    )
    assert app.called is False
    assert upload.read == 0
