"""Log formats for ``EFFECT_BROKER_LOG_FORMAT``: ``plain`` lines or one JSON object each.

Every broker log call passes structured fields in ``extra`` (STYLE rule 8:
``action``, ``effect_id``, ...); the JSON format keeps them as fields so a log
pipeline can filter on ``effect_id`` instead of parsing text. procrastinate's worker
does the same (``action``, ``job``, ``worker``).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

#: Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the extras."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in body:
                body[key] = value
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """``time LEVEL logger message key=value ...``: the extras stay visible."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [
            f"{key}={value}"
            for key, value in vars(record).items()
            if key not in _STANDARD and not isinstance(value, dict | list)
        ]
        if not extras:
            return line
        head, sep, tail = line.partition("\n")  # keep a traceback below the fields
        return f"{head} {' '.join(extras)}{sep}{tail}"


#: procrastinate jobs that run on a timer whatever the load: the sweep every second and
#: the hourly cleanup. Their start, end and deferral lines are routine.
ROUTINE_TASKS = frozenset({"effect_broker.sweep", "effect_broker.remove_finished_jobs"})
#: procrastinate's lines about loading the app's own task list, logged by every process
#: that loads it (six lines before ``effect-broker worker --help`` printed its usage):
#: they describe the code, not what happened.
ROUTINE_ACTIONS = frozenset({"registering_periodic_task", "loading_blueprint"})


class RoutineJobsAtDebug(logging.Filter):
    """procrastinate's INFO lines about routine jobs are DEBUG lines.

    Issue 20: a worker at INFO logged three lines a second for the sweep (deferred,
    started, ended), about 80% of its log, burying the lines about effects. A sweep
    that acts says so itself (``services.sweeper``: one warning with its counts), so
    these lines only ever said "nothing to do". Likewise the lines about registering
    the app's periodic tasks and blueprints at start-up (``ROUTINE_ACTIONS``). At DEBUG
    they are still there.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        job = getattr(record, "job", None)
        task = job.get("task_name") if isinstance(job, dict) else None
        if task not in ROUTINE_TASKS and getattr(record, "action", None) not in (
            ROUTINE_ACTIONS
        ):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
