"""The API's ASGI handler (issue 25 item 2): Django's own middleware without a thread
hop per hook, and the API's sync views on threads kept for the process instead of a
thread started (and joined) per request."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest
from asgiref import sync
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponse
from django.urls import path

from config.urls import urlpatterns as project_urlpatterns
from effect_broker.api.asgi_handler import HopFreeASGIHandler
from effect_broker.api.inline_middleware import HOP_FREE

seen_threads: list[str] = []


def sync_api_view(request: HttpRequest) -> HttpResponse:
    """A sync view on an API path: records the thread it runs on."""
    seen_threads.append(threading.current_thread().name)
    return HttpResponse(b"{}", content_type="application/json")


urlpatterns = [path("v1/test-thread", sync_api_view), *project_urlpatterns]


@pytest.fixture
def counted_hops(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """sync_to_async calls, by the name of the function sent to a thread."""
    hops: Counter[str] = Counter()
    original = sync.SyncToAsync.__call__

    async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        hops[getattr(self.func, "__qualname__", repr(self.func))] += 1
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__call__", counting)
    return hops


def get(app: Any, path_: str) -> int:
    """One GET through ``app``; its status."""
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path_,
        "raw_path": path_.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    body = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop(0)
        await asyncio.Event().wait()  # no disconnect: Django listens for one
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return int(sent[0]["status"])


def test_healthz_takes_only_djangos_own_two_hops(
    counted_hops: Counter[str], settings: Any
) -> None:  # settings: DEBUG on, WhiteNoise looking on disk for static paths
    # Given the API's handler, whose settings list Django's and WhiteNoise's
    # middleware by their own dotted paths (the deploy checks look for them)
    assert set(HOP_FREE) <= set(settings.MIDDLEWARE)
    app = HopFreeASGIHandler()
    assert get(app, "/healthz") == 200
    counted_hops.clear()
    # When /healthz is served
    assert get(app, "/healthz") == 200
    # Then the only hops are the request_started receivers and response.close
    assert counted_hops == Counter(
        {"Signal.asend.<locals>.sync_send": 1, "HttpResponseBase.close": 1}
    )


def test_djangos_stock_handler_hops_per_middleware_hook(
    counted_hops: Counter[str],
) -> None:
    # What the API's handler saves: the same request through Django's handler
    app = ASGIHandler()
    assert get(app, "/healthz") == 200
    counted_hops.clear()
    assert get(app, "/healthz") == 200
    assert sum(counted_hops.values()) >= 6, counted_hops


def test_sync_api_views_run_on_threads_kept_for_the_process(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__
    app = HopFreeASGIHandler(threads=1)
    seen_threads.clear()
    for _ in range(3):
        assert get(app, "/v1/test-thread") == 200
    # One kept thread served all three (Django starts a new one per request)
    assert len(seen_threads) == 3
    assert len(set(seen_threads)) == 1
    assert seen_threads[0].startswith("api-view")
