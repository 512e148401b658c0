"""``serve`` ships static files with or without WhiteNoise (issue 11: no admin CSS)."""

from __future__ import annotations

from typing import Any

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from effect_broker.management.commands.serve import uvicorn_argv
from effect_broker.serving import WHITENOISE, with_static_files


async def api(scope: Any, receive: Any, send: Any) -> None:
    """Stands in for the API application."""


def test_without_whitenoise_django_serves_static_files(settings: Any) -> None:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != WHITENOISE]
    wrapped = with_static_files(api)
    assert isinstance(wrapped, ASGIStaticFilesHandler)
    assert wrapped.application is api


def test_with_whitenoise_the_api_is_served_as_is(settings: Any) -> None:
    settings.MIDDLEWARE = [WHITENOISE, *settings.MIDDLEWARE]
    assert with_static_files(api) is api


def test_uvicorn_command_line() -> None:
    options = {
        "host": "0.0.0.0",  # noqa: S104
        "port": 9000,
        "workers": 3,
        "graceful_timeout": 12,
        "log_level": "info",
        "forwarded_allow_ips": "",
        "access_log": False,
    }
    argv = uvicorn_argv(options)
    assert argv[1:4] == ["-m", "uvicorn", "effect_broker.serving:application"]
    joined = " ".join(argv)
    assert "--host 0.0.0.0 --port 9000 --workers 3" in joined
    assert "--timeout-graceful-shutdown 12" in joined
    assert "--no-proxy-headers" in argv
    assert "--no-access-log" in argv
