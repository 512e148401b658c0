"""Django settings, read from the environment (see docs/reference/configuration.md).

``EFFECT_BROKER_ENV=production`` refuses to start without a database URL, a master key,
``DEBUG`` off and a real ``SECRET_KEY``; development fills safe local defaults so a fresh
clone runs with no configuration at all.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

from config import capacity
from config.database import choose_database, with_connection_safety
from config.environment import (
    env_bool,
    load_master_keys,
    refuse_unsafe_production,
)
from config.transport_security import transport_security
from effect_broker.observability import settings_values as observability
from effect_broker.observability.database import with_query_metrics

BASE_DIR = Path(__file__).resolve().parent.parent
#: Where a process keeps what it generates (the development master key, collected
#: static files): the checkout itself; for an installed package, whose BASE_DIR lies
#: in site-packages, EFFECT_BROKER_STATE_DIR or the current directory.
STATE_DIR = Path(
    os.environ.get("EFFECT_BROKER_STATE_DIR", "").strip()
    or (BASE_DIR if (BASE_DIR / "pyproject.toml").exists() else Path.cwd())
)

EFFECT_BROKER_ENV = os.environ.get("EFFECT_BROKER_ENV", "development").strip().lower()
PRODUCTION = EFFECT_BROKER_ENV == "production"

DEBUG = env_bool("DEBUG", default=not PRODUCTION)
# Development gets a fixed, obviously-fake key; production must bring its own.
SECRET_KEY = os.environ.get("SECRET_KEY", "") or (
    "" if PRODUCTION else "dev-insecure-effect-broker-secret-key-do-not-deploy"
)
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get(
        "ALLOWED_HOSTS", "" if PRODUCTION else "localhost,127.0.0.1,testserver"
    ).split(",")
    if h.strip()
]

#: The master keyring (domain/master_keys.py): the last key encrypts new payloads,
#: each key decrypts what it wrote; the file it came from, when it can be rotated.
EFFECT_BROKER_MASTER_KEYS, EFFECT_BROKER_MASTER_KEY_PATH = load_master_keys(
    STATE_DIR, production=PRODUCTION
)
#: The hashing root (the keyring's first key): request-hash and per-tenant HMAC keys
#: are derived from it.
EFFECT_BROKER_MASTER_KEY: bytes | None = (
    EFFECT_BROKER_MASTER_KEYS.hash_root if EFFECT_BROKER_MASTER_KEYS else None
)
#: Path of the versioned tool-contract file (TOML).
EFFECT_BROKER_CONTRACTS = os.environ.get(
    "EFFECT_BROKER_CONTRACTS", str(BASE_DIR / "examples" / "contracts.toml")
)

refuse_unsafe_production(
    production=PRODUCTION,
    database_url=os.environ.get("DATABASE_URL", ""),
    master_key=EFFECT_BROKER_MASTER_KEY,
    debug=DEBUG,
    secret_key=SECRET_KEY,
)

# HTTPS: redirect, HSTS and secure cookies by default in production (config/
# transport_security.py; `check --deploy` reports nothing).
globals().update(transport_security(production=PRODUCTION))

INSTALLED_APPS = [
    "django.contrib.admin",
    # Before django.contrib.auth, so its createsuperuser (no bypass of the password
    # validators) is the one Django runs. Its templates and static files are all
    # under effect_broker/ names, so the order changes nothing else.
    "effect_broker",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "procrastinate.contrib.django",
]

# django-ninja's templates and its bundled Swagger UI assets (ninja/static), so /docs
# loads them from STATIC_URL, never from a CDN (issue 11). Found by location rather
# than by listing "ninja" in INSTALLED_APPS: an installed app is imported by every
# process, and importing ninja pulls in pydantic, django.test, jinja2 and unittest -
# a quarter of the start-up of every worker and CLI command, none of which serves
# an API (the API process imports ninja with its URLs).
NINJA_DIR = Path(find_spec("ninja").submodule_search_locations[0])  # type: ignore[union-attr,index]

# Session, auth and messages serve only the admin: on the API's routes (/v1/,
# /healthz, /readyz, /metrics) these subclasses of Django's own pass the request
# straight on, which under ASGI saves two thread hops each (issue 13: /healthz cost
# 3.3-5.3 ms of CPU). Being subclasses, they satisfy the admin's system checks.
MIDDLEWARE = [
    # Outermost of all: django-prometheus's HTTP metrics, without thread hops, so
    # even a request the boundary refuses is counted (docs/observability.md).
    "effect_broker.observability.http_metrics.http_metrics_middleware",
    # Outermost: a bad Host or text PostgreSQL refuses in the path or query string is
    # refused here, and every error off the admin leaves as problem+json, never a
    # debug page, whatever DEBUG says (issue 12).
    "effect_broker.api.boundary.http_boundary",
    "django.middleware.security.SecurityMiddleware",
    # Static files (the admin's CSS, /docs' Swagger UI) from the same process, as
    # served by uvicorn in production (issue 11: the admin had no CSS there).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "effect_broker.api.admin_middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "effect_broker.api.admin_middleware.AuthenticationMiddleware",
    "effect_broker.api.admin_middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # No connection to be had (pool timeout, PostgreSQL full): 503 overloaded with
    # Retry-After on every route, like the API's own handler, never a 500.
    "effect_broker.api.problems.CapacityErrorMiddleware",
    # The caller's W3C traceparent becomes the submit span's parent (tracing).
    "effect_broker.observability.tracing.trace_context_middleware",
    # The database out of reach (down, restarting, failing over): 503
    # database_unavailable with Retry-After, never a 500 (issue 11). Listed last, so
    # Django runs it first: an outage is answered before capacity is considered.
    "effect_broker.api.database_unavailable.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [NINJA_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

#: api | worker | cli, set by config/asgi.py and the worker command (config/capacity.py).
EFFECT_BROKER_PROCESS_ROLE = capacity.process_role()
DATABASES = {
    # with_query_metrics: django-prometheus's query metrics; the pool is untouched.
    "default": with_query_metrics(
        capacity.apply_role(
            # Keepalives and bounded timeouts on every connection, Django's and the
            # procrastinate worker's (it reads these OPTIONS): issue 11.
            with_connection_safety(choose_database()),
            EFFECT_BROKER_PROCESS_ROLE,
        )
    )
}
#: Whether the hottest ledger statements (reservation, fenced transitions) are
#: prepared on the server (effect_broker.store.prepared). Set "off" when connections
#: go through a transaction-mode pooler that does not keep prepared statements
#: (PgBouncer before 1.21, or 1.21+ with max_prepared_statements = 0).
_prepared = (
    os.environ.get("EFFECT_BROKER_DB_PREPARED_STATEMENTS", "").strip().lower() or "on"
)
if _prepared not in ("on", "off"):
    from effect_broker.domain.errors import ConfigurationError

    raise ConfigurationError(
        f"EFFECT_BROKER_DB_PREPARED_STATEMENTS must be on or off, got {_prepared!r}"
    )
EFFECT_BROKER_DB_PREPARED_STATEMENTS = _prepared == "on"
#: Where the API's one LISTEN connection (services.awaiting.ChangeHub: the long-poll,
#: the MCP proxy tools' waits) connects, when not to DATABASE_URL: behind a pooler in
#: transaction mode (PgBouncer), a LISTEN lasts only as long as its transaction's
#: server connection, so the listener must reach PostgreSQL directly (issue 25;
#: docs/scaling.md). Unset: DATABASE_URL.
EFFECT_BROKER_LISTEN_DATABASE_URL = (
    os.environ.get("EFFECT_BROKER_LISTEN_DATABASE_URL", "").strip() or None
)
#: The API process's in-flight request limit (effect_broker.api.admission).
EFFECT_BROKER_API_ADMISSION = capacity.admission(
    EFFECT_BROKER_PROCESS_ROLE, DATABASES["default"]
)
#: Who may read /docs and /openapi.json: public | staff | off (effect_broker.api.
#: docs_access). Off in production unless asked for (issue 12: they were public).
EFFECT_BROKER_API_DOCS = os.environ.get("EFFECT_BROKER_API_DOCS", "").strip().lower() or (
    "off" if PRODUCTION else "public"
)
if EFFECT_BROKER_API_DOCS not in ("public", "staff", "off"):
    from effect_broker.domain.errors import ConfigurationError

    raise ConfigurationError(
        "EFFECT_BROKER_API_DOCS must be public, staff or off, "
        f"got {EFFECT_BROKER_API_DOCS!r}"
    )


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not (raw.isdigit() and int(raw) > 0):
        from effect_broker.domain.errors import ConfigurationError

        raise ConfigurationError(f"{name} must be a positive integer, got {raw!r}")
    return int(raw)


def _non_negative(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses NaN
        from effect_broker.domain.errors import ConfigurationError

        raise ConfigurationError(f"{name} must be a number >= 0, got {raw!r}")
    return value


#: Largest request body accepted, in bytes (effect_broker.api.body_limit refuses a
#: larger one with 413 before reading it; issue 12). Django's own limit is the same
#: figure, so a body that reaches Django some other way (WSGI) is refused alike.
EFFECT_BROKER_MAX_BODY_BYTES = _positive_int("EFFECT_BROKER_MAX_BODY_BYTES", 256 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = EFFECT_BROKER_MAX_BODY_BYTES


def _positive(name: str, default: float) -> float:
    value = _non_negative(name, default)
    if value == 0 or value == float("inf"):
        from effect_broker.domain.errors import ConfigurationError

        raise ConfigurationError(f"{name} must be a finite number > 0, got {value!r}")
    return value


#: How long a request body may take to arrive, in seconds, and the slowest average
#: rate it may arrive at, in bytes per second after a 5 s head start: a slower body
#: is 408 (effect_broker.api.body_limit; issue 19: 8 trickling clients made every
#: other request a 503).
EFFECT_BROKER_BODY_TIMEOUT = _positive("EFFECT_BROKER_BODY_TIMEOUT", 30.0)
EFFECT_BROKER_BODY_MIN_RATE = _positive("EFFECT_BROKER_BODY_MIN_RATE", 1024.0)
#: Web origins whose pages may call /mcp (effect_broker.mcp.request_guards; issue 19):
#: "https://app.example.com", or "http://localhost:*" for any port. A request with no
#: Origin header (a non-browser client) is not affected; any other Origin is a 403.
EFFECT_BROKER_MCP_ALLOWED_ORIGINS = [
    origin.strip()
    for origin in os.environ.get("EFFECT_BROKER_MCP_ALLOWED_ORIGINS", "").split(",")
    if origin.strip()
]
#: Admin login throttling (effect_broker.admin_login; issue 19): this many failed
#: logins for one username from one address lock that pair out for the window.
AUTHENTICATION_BACKENDS = ["effect_broker.admin_login.ThrottledModelBackend"]
EFFECT_BROKER_ADMIN_LOGIN_MAX_FAILURES = _positive_int(
    "EFFECT_BROKER_ADMIN_LOGIN_MAX_FAILURES", 5
)
EFFECT_BROKER_ADMIN_LOGIN_LOCKOUT_SECONDS = _positive_int(
    "EFFECT_BROKER_ADMIN_LOGIN_LOCKOUT_SECONDS", 900
)
#: Django's four password validators in production, enforced on every password set
#: (createsuperuser's bypass prompt and --noinput included: effect_broker's own
#: command; issue 19: production took "1"). Development keeps none.
AUTH_PASSWORD_VALIDATORS = (
    [
        {"NAME": f"django.contrib.auth.password_validation.{name}"}
        for name in (
            "UserAttributeSimilarityValidator",
            "MinimumLengthValidator",
            "CommonPasswordValidator",
            "NumericPasswordValidator",
        )
    ]
    if PRODUCTION
    else []
)
#: Caps on a submit's arguments (effect_broker.domain.argument_limits; issue 12).
EFFECT_BROKER_ARGUMENT_LIMITS = {
    "max_keys": _positive_int("EFFECT_BROKER_MAX_ARGUMENT_KEYS", 1000),
    "max_depth": _positive_int("EFFECT_BROKER_MAX_ARGUMENT_DEPTH", 20),
    "max_string_length": _positive_int("EFFECT_BROKER_MAX_ARGUMENT_STRING_LENGTH", 65536),
}
#: Most items one batch submit may carry (effect_broker.services.batch_submission;
#: issue 13); a larger batch is refused whole (400 invalid_request, ``limit``).
EFFECT_BROKER_MAX_BATCH_ITEMS = _positive_int("EFFECT_BROKER_MAX_BATCH_ITEMS", 100)
# Where a problem's ``type`` points (issue 21): ``{base}{code}``. The default is the
# page this broker serves itself, so the URI resolves against any running broker.
EFFECT_BROKER_PROBLEM_BASE_URL = (
    os.environ.get("EFFECT_BROKER_PROBLEM_BASE_URL", "").strip() or "/problems/"
)


def _http_url(name: str) -> str:
    """An http(s) URL from the environment, or "" when unset; one line if malformed."""
    value = os.environ.get(name, "").strip()
    if value and not value.startswith(("https://", "http://")):
        from effect_broker.domain.errors import ConfigurationError

        raise ConfigurationError(f"{name} must be an http(s):// URL, got {value!r}")
    return value


#: Where callers and operators reach this broker (https://broker.example.com), when it
#: knows: the approval page's address in MCP answers and approval notices (issue 24).
EFFECT_BROKER_PUBLIC_URL = _http_url("EFFECT_BROKER_PUBLIC_URL")
#: The optional approval webhook (effect_broker/services/approval_notices.py): a
#: Slack-compatible notice of every effect that starts awaiting approval, signed with
#: the secret (HMAC-SHA256), which is therefore required with the URL.
EFFECT_BROKER_APPROVAL_WEBHOOK_URL = _http_url("EFFECT_BROKER_APPROVAL_WEBHOOK_URL")
EFFECT_BROKER_APPROVAL_WEBHOOK_SECRET = os.environ.get(
    "EFFECT_BROKER_APPROVAL_WEBHOOK_SECRET", ""
).strip()
if EFFECT_BROKER_APPROVAL_WEBHOOK_URL and not EFFECT_BROKER_APPROVAL_WEBHOOK_SECRET:
    from effect_broker.domain.errors import ConfigurationError

    raise ConfigurationError(
        "EFFECT_BROKER_APPROVAL_WEBHOOK_URL needs EFFECT_BROKER_APPROVAL_WEBHOOK_SECRET "
        "(the notices are signed with it)"
    )
#: Per-tenant submits per second in each API process (0 turns the limit off) and the
#: burst a quiet tenant may spend at once (effect_broker.api.rate_limit; issue 12).
EFFECT_BROKER_TENANT_SUBMIT_RATE = _non_negative(
    "EFFECT_BROKER_TENANT_SUBMIT_RATE", 100.0
)
EFFECT_BROKER_TENANT_SUBMIT_BURST = _non_negative(
    "EFFECT_BROKER_TENANT_SUBMIT_BURST", 2 * EFFECT_BROKER_TENANT_SUBMIT_RATE
)
#: Directory of per-tenant secret files that {"$secret": "file:NAME"} arguments name
#: (<dir>/<tenant id>/NAME); unset: file references are unavailable. Env references
#: read EFFECT_BROKER_SECRET_<NAME> (effect_broker/services/secrets.py).
EFFECT_BROKER_SECRETS_DIR = os.environ.get("EFFECT_BROKER_SECRETS_DIR", "").strip()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
#: ninja's static folder holds a ``ninja/`` folder: its assets keep their
#: ``/static/ninja/...`` names, as when ninja was an installed app.
STATICFILES_DIRS = [NINJA_DIR / "static"]
#: Where ``manage.py collectstatic`` gathers the static files WhiteNoise serves in
#: production (docs/tutorial/first-hour.md); development serves them from the apps
#: (finders).
STATIC_ROOT = Path(
    os.environ.get("EFFECT_BROKER_STATIC_ROOT", "") or STATE_DIR / "staticfiles"
)
WHITENOISE_USE_FINDERS = DEBUG
# collectstatic also writes a gzip copy of each file, which WhiteNoise sends to clients
# that accept it (/docs' Swagger bundle: 1.5 MB). Not the manifest variant: hashed
# names would make every template fail to render until collectstatic has run.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Development rescans per request (an edited file shows at once) and so does not warn
# about a STATIC_ROOT that no collectstatic has filled yet; production reads it once.
WHITENOISE_AUTOREFRESH = DEBUG

#: plain (default) or json: one JSON object per line (effect_broker.log_format).
EFFECT_BROKER_LOG_FORMAT = (
    os.environ.get("EFFECT_BROKER_LOG_FORMAT", "").strip().lower() or "plain"
)
if EFFECT_BROKER_LOG_FORMAT not in ("plain", "json"):
    from effect_broker.domain.errors import ConfigurationError

    raise ConfigurationError(
        "EFFECT_BROKER_LOG_FORMAT must be plain or json, "
        f"got {EFFECT_BROKER_LOG_FORMAT!r}"
    )
# Servers log at INFO by default; a one-shot command (role cli) only warnings, so its
# own output is not buried under start-up lines.
_LOG_LEVEL = os.environ.get("EFFECT_BROKER_LOG_LEVEL", "").strip().upper() or (
    "WARNING" if EFFECT_BROKER_PROCESS_ROLE == capacity.CLI else "INFO"
)
if _LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    from effect_broker.domain.errors import ConfigurationError

    raise ConfigurationError(
        "EFFECT_BROKER_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, "
        f"got {_LOG_LEVEL!r}"
    )
# The broker's and procrastinate's loggers (issue 11: the worker log was silent).
# At INFO a worker logs each job's start and end (procrastinate) and every
# outcome_unknown with its effect id (effect_broker.services.outcomes); no broker
# log line carries arguments, outputs or keys.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"()": "effect_broker.log_format.PlainFormatter"},
        "json": {"()": "effect_broker.log_format.JsonFormatter"},
    },
    "filters": {
        # The periodic sweep's start/end lines at DEBUG (issue 20: 80% of the log).
        "routine_jobs": {"()": "effect_broker.log_format.RoutineJobsAtDebug"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": EFFECT_BROKER_LOG_FORMAT,
            # On the handler: a logger's own filters skip records its children
            # (procrastinate.worker, procrastinate.periodic) propagate to it.
            "filters": ["routine_jobs"],
        }
    },
    "loggers": {
        "effect_broker": {
            "handlers": ["console"],
            "level": _LOG_LEVEL,
        },
        "procrastinate": {
            "handlers": ["console"],
            # At INFO: each job's start and end. The API only defers jobs, so it keeps
            # procrastinate to warnings (its start-up lines say nothing there).
            "level": _LOG_LEVEL
            if EFFECT_BROKER_PROCESS_ROLE == capacity.WORKER or _LOG_LEVEL != "INFO"
            else "WARNING",
        },
        "django": {
            "handlers": ["console"],
            # Django's INFO and DEBUG are per request and per query.
            "level": _LOG_LEVEL if _LOG_LEVEL in ("ERROR", "CRITICAL") else "WARNING",
        },
    },
}


# --- Engine: leases, heartbeats and recovery (docs/explanation/workers.md) ---------
def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        from effect_broker.domain.errors import ConfigurationError

        raise ConfigurationError(
            f"{name} must be a number of seconds, got {raw!r}"
        ) from None


EFFECT_BROKER_TIMING = {
    "lease_seconds": _seconds("EFFECT_BROKER_LEASE_SECONDS", 30.0),
    "heartbeat_seconds": _seconds("EFFECT_BROKER_HEARTBEAT_SECONDS", 10.0),
    # The send gate refuses to send with less than this left on the lease, and a
    # negative lookup after a lost worker waits this much longer
    # (docs/explanation/workers.md): it covers the window between the gate and the
    # socket write.
    "send_margin_seconds": _seconds("EFFECT_BROKER_SEND_MARGIN_SECONDS", 2.0),
    "retention_margin_seconds": _seconds("EFFECT_BROKER_RETENTION_MARGIN_SECONDS", 60.0),
    "reconcile_window_seconds": _seconds(
        "EFFECT_BROKER_RECONCILE_WINDOW_SECONDS", 3600.0
    ),
    "redefer_grace_seconds": _seconds("EFFECT_BROKER_REDEFER_GRACE_SECONDS", 10.0),
    "sweep_seconds": _seconds("EFFECT_BROKER_SWEEP_SECONDS", 5.0),
    "stalled_job_seconds": _seconds("EFFECT_BROKER_STALLED_JOB_SECONDS", 30.0),
}

#: /readyz fails when no worker heartbeated within this many seconds (0: not checked;
#: effect_broker.api.health). Default: the stalled-worker timeout below.
EFFECT_BROKER_READY_WORKER_SECONDS = _seconds(
    "EFFECT_BROKER_READY_WORKER_SECONDS", EFFECT_BROKER_TIMING["stalled_job_seconds"]
)


def _hours(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        value = int(raw) if raw.strip() else default
    except ValueError:
        value = -1
    if value < 0:
        from effect_broker.domain.errors import ConfigurationError

        raise ConfigurationError(
            f"{name} must be a whole number of hours (0 or more), got {raw!r}"
        )
    return value


# procrastinate's job tables stay bounded (issue 13: they grew by a row or more per
# effect, forever). procrastinate's own delete query removes a finished job and, by
# its ON DELETE CASCADE, its events; the ledger (intents, events, attempts, receipts)
# is the authority and is never touched. Succeeded jobs go first; failed, aborted and
# cancelled ones are kept longer because an operator reads them to find out what went
# wrong (the admin console's "linked jobs"). Running and queued jobs are never removed.
EFFECT_BROKER_JOB_RETENTION = {
    # 0: the worker deletes a job the moment it succeeds (procrastinate's
    # delete_jobs="successful"), which also saves the periodic delete its work.
    "succeeded_hours": _hours("EFFECT_BROKER_JOB_RETENTION_HOURS", 24),
    # Removes every finished job older than this, whatever its status.
    "finished_hours": _hours("EFFECT_BROKER_FAILED_JOB_RETENTION_HOURS", 24 * 7),
}

# procrastinate: a worker heartbeats well below the stalled timeout, so a live worker is
# never pruned by a peer that starts (procrastinate prunes on start; a pruned live worker
# crashes on its next fetch).
PROCRASTINATE_WORKER_DEFAULTS = {
    "update_heartbeat_interval": max(
        0.5, EFFECT_BROKER_TIMING["stalled_job_seconds"] / 6
    ),
    "stalled_worker_timeout": EFFECT_BROKER_TIMING["stalled_job_seconds"],
    # An idle worker also polls (procrastinate's default: every 5 s): a job scheduled
    # for later (a reconcile due at the settlement deadline) starts at the next poll
    # (docs/benchmarks.md: up to 5 s added to reconciliation). A NOTIFY procrastinate
    # loses (one that lands during a fetch, or a job skipped for a lock) no longer
    # waits for it: effect_broker.workers.wakeups.
    "fetch_job_polling_interval": _seconds("EFFECT_BROKER_JOB_POLL_SECONDS", 1.0),
    "shutdown_graceful_timeout": 30.0,
    "delete_jobs": "successful"
    if EFFECT_BROKER_JOB_RETENTION["succeeded_hours"] == 0
    else "never",
}

# --- Observability (docs/observability.md) ----------------------------------------
#: Who may read the API's /metrics: public | token | off (and the bearer token).
EFFECT_BROKER_METRICS_ACCESS, EFFECT_BROKER_METRICS_TOKEN = observability.metrics_access(
    production=PRODUCTION
)
#: A worker's own metrics port (unset: none) and the address it binds.
EFFECT_BROKER_WORKER_METRICS_PORT = observability.worker_metrics_port()
EFFECT_BROKER_WORKER_METRICS_ADDR = (
    os.environ.get("EFFECT_BROKER_WORKER_METRICS_ADDR", "").strip() or "0.0.0.0"  # noqa: S104
)
#: Unknown-age alert threshold of a contract that names none (unknown_alert_after).
EFFECT_BROKER_UNKNOWN_ALERT_AFTER_SECONDS = _seconds(
    "EFFECT_BROKER_UNKNOWN_ALERT_AFTER_SECONDS", 900.0
)
