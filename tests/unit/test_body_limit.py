"""The body-size limit (effect_broker.api.body_limit.BodySizeLimit), driven with a
fake ASGI application that reads the body as Django does: all of it, first."""

from __future__ import annotations

import asyncio
import json
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
