"""``serve`` ships static files with or without WhiteNoise (issue 11: no admin CSS)."""

from __future__ import annotations

from typing import Any

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from effect_broker.management.commands.serve import gunicorn_argv, uvicorn_argv
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
    # h11 even where httptools is installed: httptools answers ambiguous framing
    # itself, in text/plain, before the body limits can refuse it as problem+json.
    assert argv[argv.index("--http") + 1] == "h11"


def test_wsgi_command_line_is_gunicorn_threads_without_the_query_in_its_log() -> None:
    options = {
        "host": "0.0.0.0",  # noqa: S104
        "port": 9000,
        "workers": 2,
        "threads": 6,
        "graceful_timeout": 12,
        "log_level": "info",
        "forwarded_allow_ips": "",
        "access_log": True,
    }
    argv = gunicorn_argv(options)
    assert argv[1:4] == ["-m", "gunicorn", "config.wsgi:application"]
    joined = " ".join(argv)
    assert "--bind 0.0.0.0:9000 --workers 2 --worker-class gthread --threads 6" in joined
    assert "--graceful-timeout 12" in joined
    # A refused credential in the query string must not reach the access log:
    # %(U)s is the path without its query (%(r)s, gunicorn's default, has it).
    log_format = argv[argv.index("--access-logformat") + 1]
    assert "%(U)s" in log_format
    assert "%(r)s" not in log_format
    assert "%(q)s" not in log_format
