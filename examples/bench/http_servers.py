"""What the HTTP bench runs and watches: real uvicorn API processes, the CPU time of
the API and of the PostgreSQL server, and the database connections they hold.

CPU comes from ``/proc``, so the API process and the database server must run on
this machine (the bench's own embedded server always does):

* the API: ``utime + stime`` of the uvicorn process (all its threads);
* PostgreSQL: the whole server's process tree. Backends come and go (one per request
  without a pool), so sampling live backends would miss the ones that exited. The
  postmaster reaps every backend it forks, and the kernel adds a reaped child's CPU
  time to the parent's ``cutime``/``cstime``; so the server's CPU is the postmaster's
  own and reaped children's time plus the time of the children alive now. A backend
  exiting between the two reads is counted twice or not at all: one backend's CPU
  (a few ms) at each end of a window of seconds. Background processes (WAL writer,
  checkpointer) are included: their work is part of what a commit costs.

Open connections are sampled from ``pg_stat_activity`` every 50 ms over a separate
connection to another database, by ``application_name`` (each variant sets its own).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import psycopg

from examples.bench.environment import ROOT

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat from field 3 (state) on; the name may hold spaces."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid``, all threads."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if int(_stat(int(entry.name))[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    return found


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid``, its reaped children and its live children."""
    live = 0.0
    for child in _children(pid):
        try:
            live += process_cpu(child)
        except OSError:
            continue
    fields = _stat(pid)
    own_and_reaped = sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICKS
    return own_and_reaped + live


def postmaster_pid(database_url: str) -> int | None:
    """The PostgreSQL server's main process, if it runs on this machine; else None."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        # Read while the connection is open: once it closes, its backend exits and
        # /proc has nothing to say (a race that made a run report "elsewhere").
        try:
            parent = int(_stat(int(row[0]))[1])  # type: ignore[index]
            cmdline = Path(f"/proc/{parent}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
    return parent if b"postgres" in cmdline else None


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Variant:
    """One way of running the API process: a uvicorn application and its flags, or
    ``serve``'s own command line (``serve_options``: what ``effect-broker serve``
    would exec, WSGI or ASGI, with the port filled in)."""

    key: str
    label: str
    uvicorn_app: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    #: ``serve``'s options (``--wsgi`` and the like): the command is serve's.
    serve_options: dict[str, Any] | None = None

    def argv(self, port: int) -> list[str]:
        """The server's command line on ``port``."""
        if self.serve_options is not None:
            from effect_broker.management.commands.serve import (
                default_threads,
                gunicorn_argv,
                uvicorn_argv,
            )

            options = {**SERVE_DEFAULTS, **self.serve_options, "port": port}
            if options.get("wsgi"):
                options["threads"] = options.get("threads") or default_threads()
                return gunicorn_argv(options)
            return uvicorn_argv(options)
        return [
            sys.executable,
            "-m",
            "uvicorn",
            *self.uvicorn_app,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
        ]


#: ``serve``'s options as the bench runs it: one process, quiet, no access log.
SERVE_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "workers": 1,
    "graceful_timeout": 5,
    "log_level": "warning",
    "forwarded_allow_ips": "",
    "access_log": False,
    "wsgi": False,
    "threads": None,
}
#: The bench's settings for served processes: the project's, plus one bare view.
BARE_VIEW_SETTINGS = {"DJANGO_SETTINGS_MODULE": "examples.bench.served_settings"}

VARIANTS = {
    "before": Variant(
        "before",
        "before: as on main (a new connection per request, every middleware, no limit)",
        ("--factory", "django.core.asgi:get_asgi_application", "--lifespan", "off"),
        {"DJANGO_SETTINGS_MODULE": "examples.bench.http_baseline_settings"},
    ),
    "pooled": Variant(
        "pooled",
        "ASGI as served: effect-broker serve (uvicorn, config.asgi: pool, in-flight "
        "limit, no thread hop in the middleware)",
        env=BARE_VIEW_SETTINGS,
        serve_options={},
    ),
    "hops": Variant(
        "hops",
        "ASGI before issue 25: the same guards around Django's stock ASGI handler "
        "(a thread hop per middleware hook), uvicorn with h11",
        ("examples.bench.asgi_with_hops:application", "--http", "h11"),
        BARE_VIEW_SETTINGS,
    ),
    "httptools": Variant(
        "httptools",
        "ASGI as served, but uvicorn's httptools parser (C) instead of h11",
        ("config.asgi:application", "--http", "httptools", "--lifespan", "on"),
        BARE_VIEW_SETTINGS,
    ),
    "wsgi": Variant(
        "wsgi",
        "WSGI: effect-broker serve --wsgi (gunicorn gthread, threads = pool size)",
        env=BARE_VIEW_SETTINGS,
        serve_options={"wsgi": True},
    ),
}


class ApiServer:
    """One real API process (uvicorn, or gunicorn for ``serve --wsgi``; one worker
    process) on a free port."""

    def __init__(
        self, variant: Variant, env: dict[str, str], log_dir: Path, root: Path = ROOT
    ) -> None:
        """``root``: the source tree to serve (``api_cpu_ab`` compares two trees)."""
        self.variant = variant
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.application_name = f"eb-http-{variant.key}"
        self.log_path = log_dir / f"uvicorn-{variant.key}.log"
        self._log: IO[bytes] = self.log_path.open("wb")
        url = env["DATABASE_URL"]
        sep = "&" if "?" in url else "?"
        full_env = {
            # One tenant drives every request of the load bench: the per-tenant submit
            # limit (issue 12) would measure the limiter, not the path. Off unless the
            # caller sets it (the noisy-neighbour bench does).
            "EFFECT_BROKER_TENANT_SUBMIT_RATE": "0",
            **env,
            **variant.env,
            "DATABASE_URL": f"{url}{sep}application_name={self.application_name}",
        }
        if root != ROOT:
            full_env["PYTHONPATH"] = str(root)
        if variant.serve_options is not None:
            # What ``serve`` puts in the environment before it execs the server.
            from config.capacity import API, ROLE_ENV

            full_env[ROLE_ENV] = API
        self.process = subprocess.Popen(
            variant.argv(self.port),
            cwd=root,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until ``/healthz`` answers 200 (the first request loads Django)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.variant.key} API exited:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.variant.key} API did not start:\n{self.log_tail()}")

    def cpu_seconds(self) -> float:
        """CPU time the API process has used so far (gunicorn: master and worker)."""
        return process_tree_cpu(self.process.pid)

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log."""
        self._log.flush()
        text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (uvicorn finishes in-flight requests, then exits), then SIGKILL."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class ConnectionSampler:
    """Samples the API processes' database connections every ``interval`` seconds."""

    def __init__(self, admin_url: str, database: str, interval: float = 0.05) -> None:
        self._admin_url = admin_url
        self._database = database
        self._interval = interval
        self._lock = threading.Lock()
        self._max: dict[str, int] = {}
        self._other_active_max = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="conn-sampler", daemon=True
        )

    def start(self) -> None:
        """Start sampling in a background thread."""
        self._thread.start()

    def reset(self) -> None:
        """Forget the maxima seen so far (start of a measurement window)."""
        with self._lock:
            self._max = {}
            self._other_active_max = 0

    def maxima(self) -> tuple[dict[str, int], int]:
        """Most connections per application_name since ``reset``, and the most
        active backends of other databases seen (others' load on a shared server)."""
        with self._lock:
            return dict(self._max), self._other_active_max

    def current(self, application_name: str) -> int:
        """Connections of ``application_name`` right now."""
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND application_name = %s",
                (self._database, application_name),
            ).fetchone()
        return int(row[0]) if row else 0

    def stop(self) -> None:
        """Stop the sampling thread."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        # One statement per sample: rows of our database by application_name, and
        # one row (NULL name) counting other databases' active client backends.
        query = (
            "SELECT CASE WHEN datname = %(db)s THEN application_name END, count(*) "
            "FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND (datname = %(db)s "
            "OR (state = 'active' AND backend_type = 'client backend')) GROUP BY 1"
        )
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            while not self._stop.wait(self._interval):
                rows = conn.execute(query, {"db": self._database}).fetchall()
                with self._lock:
                    for name, count in rows:
                        if name is None:
                            self._other_active_max = max(self._other_active_max, count)
                        else:
                            self._max[name] = max(self._max.get(name, 0), int(count))
