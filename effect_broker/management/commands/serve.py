"""``effect-broker serve``: the API in production (uvicorn, ASGI, the ``api`` role).

The command replaces itself with ``python -m uvicorn effect_broker.serving:application``
(``exec``): signals then reach uvicorn directly, so SIGTERM or Ctrl-C is a graceful
shutdown - no new connections, in-flight requests finish (up to
``--graceful-timeout``), then the lifespan shutdown closes the connection pools
(config/asgi.py). The served process declares ``EFFECT_BROKER_PROCESS_ROLE=api``, so
it gets the API's connection pool and request admission (config/capacity.py).

``--wsgi`` execs gunicorn's threaded workers on ``config.wsgi`` instead (issue 25:
an API process that spends its time on the broker, measured side by side in
``effect-broker bench``, docs/benchmarks.md). It is not the default, because it lacks
what the ASGI server has (``WSGI_LACKS``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from config.capacity import API, ROLE_ENV

APP = "effect_broker.serving:application"
WSGI_APP = "config.wsgi:application"
#: What ``serve --wsgi`` does not do that the ASGI server does (tests/acceptance/
#: test_api_hostile_clients.py proves each on ASGI): said in ``--help`` and the docs.
WSGI_LACKS = (
    "no deadline on a slow request head or body (a trickling client holds a "
    "thread: put a buffering proxy such as nginx in front), no in-flight limit "
    "(no 503 with Retry-After: requests wait for a thread), no /mcp (run "
    "'effect-broker mcp --transport http' beside it)"
)
#: gunicorn's access log without the query string: a credential sent there (refused
#: with 400) must not be written to the log, and gunicorn logs from its own parse.
WSGI_ACCESS_LOG_FORMAT = '%(h)s "%(m)s %(U)s %(H)s" %(s)s %(b)s %(M)sms'


def static_files_collected() -> bool:
    """True when STATIC_ROOT holds collectstatic's output (the admin's stylesheet)."""
    return Path(settings.STATIC_ROOT, "admin", "css", "base.css").is_file()


def uvicorn_argv(options: dict[str, Any]) -> list[str]:
    """The uvicorn command line for ``options``."""
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        APP,
        "--host",
        options["host"],
        "--port",
        str(options["port"]),
        "--workers",
        str(options["workers"]),
        "--timeout-graceful-shutdown",
        str(options["graceful_timeout"]),
        "--log-level",
        options["log_level"],
        "--lifespan",
        "on",
        # The broker's own headers and errors only (no "server: uvicorn").
        "--no-server-header",
        # h11 even where httptools is installed (uvicorn would pick it): httptools
        # answers a request with both Content-Length and chunked framing itself, in
        # text/plain, before effect_broker.api.body_limit can refuse it as
        # problem+json (tests/acceptance/test_api_hostile_clients.py). It saved
        # little next to the thread hops (docs/benchmarks.md, "One API process").
        "--http",
        "h11",
    ]
    if options["forwarded_allow_ips"]:
        argv += [
            "--proxy-headers",
            "--forwarded-allow-ips",
            options["forwarded_allow_ips"],
        ]
    else:
        argv += ["--no-proxy-headers"]
    if not options["access_log"]:
        argv.append("--no-access-log")
    return argv


def gunicorn_argv(options: dict[str, Any]) -> list[str]:
    """The gunicorn command line of ``serve --wsgi`` for ``options``."""
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        WSGI_APP,
        "--bind",
        f"{options['host']}:{options['port']}",
        "--workers",
        str(options["workers"]),
        "--worker-class",
        "gthread",
        "--threads",
        str(options["threads"]),
        "--graceful-timeout",
        str(options["graceful_timeout"]),
        "--log-level",
        options["log_level"],
        # Empty: trust no proxy's X-Forwarded-* (gunicorn's default trusts 127.0.0.1).
        "--forwarded-allow-ips",
        options["forwarded_allow_ips"],
        "--no-control-socket",
    ]
    if options["access_log"]:
        argv += ["--access-logfile", "-", "--access-logformat", WSGI_ACCESS_LOG_FORMAT]
    return argv


def default_threads() -> int:
    """``serve --wsgi``'s threads per process: the API pool's size, so that a request
    never waits for a connection and the pool bounds the connections as under ASGI."""
    from config.capacity import API, pool_size

    size = pool_size(API)
    return size.max_size if size is not None else 8


class Command(BaseCommand):
    help = (
        "Serve the API and the admin (uvicorn, production ASGI) with static files. "
        "SIGTERM stops gracefully: in-flight requests finish first. --wsgi serves "
        "the REST API and the admin from gunicorn's threaded WSGI workers instead: "
        "less CPU per request (docs/benchmarks.md), but " + WSGI_LACKS + "."
    )
    # The database is not needed to start; /readyz reports on it.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host",
            default=os.environ.get("EFFECT_BROKER_HOST", "127.0.0.1"),
            help="address to bind (default 127.0.0.1, or EFFECT_BROKER_HOST; "
            "0.0.0.0 in a container)",
        )
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("EFFECT_BROKER_PORT", "8000")),
            help="port (default 8000, or EFFECT_BROKER_PORT)",
        )
        parser.add_argument(
            "--workers",
            type=int,
            default=1,
            help="uvicorn worker processes (default 1; each has its own connection "
            "pool, so PostgreSQL needs workers x EFFECT_BROKER_API_DB_POOL_MAX_SIZE "
            "connections)",
        )
        parser.add_argument(
            "--graceful-timeout",
            type=int,
            default=30,
            metavar="SECONDS",
            help="on SIGTERM, how long in-flight requests may finish (default 30)",
        )
        parser.add_argument(
            "--log-level",
            default="info",
            choices=["critical", "error", "warning", "info", "debug"],
            help="uvicorn's log level (default info)",
        )
        parser.add_argument(
            "--no-access-log",
            dest="access_log",
            action="store_false",
            help="do not log each request",
        )
        parser.add_argument(
            "--forwarded-allow-ips",
            default="",
            metavar="IPS",
            help="trust X-Forwarded-* from these proxy addresses (default: none)",
        )
        parser.add_argument(
            "--collectstatic",
            action="store_true",
            help="run collectstatic into STATIC_ROOT (EFFECT_BROKER_STATIC_ROOT) first; "
            "in production do it once per release instead when several servers share "
            "the directory",
        )
        parser.add_argument(
            "--wsgi",
            action="store_true",
            help="serve with gunicorn's threaded WSGI workers (pip install "
            "'effect-broker[wsgi]'); not the default: " + WSGI_LACKS,
        )
        parser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="--wsgi only: threads per worker process (default: the API pool's "
            "EFFECT_BROKER_API_DB_POOL_MAX_SIZE, 8)",
        )
        parser.add_argument(
            "--print-command",
            action="store_true",
            help="print the uvicorn command instead of running it",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["workers"] < 1:
            raise CommandError("--workers must be at least 1")
        if not 0 < options["port"] < 65536:
            raise CommandError("--port must be 1-65535")
        if options["graceful_timeout"] < 0:
            raise CommandError("--graceful-timeout must be >= 0")
        if options["threads"] is not None and not options["wsgi"]:
            raise CommandError("--threads applies to --wsgi only")
        if options["wsgi"]:
            import importlib.util

            if importlib.util.find_spec("gunicorn") is None:
                raise CommandError(
                    "--wsgi needs gunicorn: pip install 'effect-broker[wsgi]'"
                )
            options["threads"] = options["threads"] or default_threads()
            if options["threads"] < 1:
                raise CommandError("--threads must be at least 1")
            argv = gunicorn_argv(options)
        else:
            argv = uvicorn_argv(options)
        if options["print_command"]:
            self.stdout.write(" ".join(argv))
            return
        from effect_broker.serving import whitenoise_enabled

        if whitenoise_enabled():
            self._static_files(collect=options["collectstatic"])
        mode = (
            f"WSGI, {options['workers']} worker(s) x {options['threads']} threads; "
            f"no /mcp here; {WSGI_LACKS.split(' (')[0]}: behind a buffering proxy only"
            if options["wsgi"]
            else f"{options['workers']} worker(s)"
        )
        self.stdout.write(
            f"serving the API on http://{options['host']}:{options['port']} "
            f"({mode}); Ctrl-C or SIGTERM stops gracefully"
        )
        from effect_broker.services.conformance_runs import warn_unproved_at_start

        # Logged (a warning per unproved idempotent/reconcilable contract), then exec.
        warn_unproved_at_start("serve")
        self.stdout.flush()
        env = {**os.environ, ROLE_ENV: API}
        # exec, not a child: signals reach the server itself (graceful shutdown), and
        # the argv is ours (sys.executable and fixed flags), not a shell string.
        os.execvpe(argv[0], argv, env)  # noqa: S606

    def _static_files(self, *, collect: bool) -> None:
        if collect:
            # WhiteNoise serves what collectstatic gathered into STATIC_ROOT.
            call_command("collectstatic", interactive=False, verbosity=0)
            self.stdout.write(f"static files collected into {settings.STATIC_ROOT}")
        elif not settings.DEBUG and not static_files_collected():
            # With DEBUG off WhiteNoise serves STATIC_ROOT only: without collectstatic
            # the admin has no styles and /docs no Swagger UI.
            self.stderr.write(
                "effect-broker serve: warning: no static files in "
                f"{settings.STATIC_ROOT}; run 'effect-broker collectstatic --noinput' "
                "(or serve --collectstatic)"
            )
