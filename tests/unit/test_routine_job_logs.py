"""A worker's log at INFO is about effects, not the once-a-second sweep (issue 20).

procrastinate logs a line when it defers, starts and ends every job; the sweep runs
every second, so about 80% of a worker's lines said "sweep: nothing". With the
project's logging configuration, those lines show only at DEBUG, while a dispatch
job's lines stay at INFO.
"""

from __future__ import annotations

import io
import logging
import logging.config
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings


@pytest.fixture
def worker_log() -> Iterator[tuple[io.StringIO, dict[str, Any]]]:
    config = {**settings.LOGGING, "loggers": dict(settings.LOGGING["loggers"])}
    config["loggers"]["procrastinate"] = {
        **config["loggers"]["procrastinate"],
        "level": "INFO",
    }
    logging.config.dictConfig(config)
    handler = logging.getLogger("procrastinate").handlers[0]
    stream = io.StringIO()
    handler.setStream(stream)  # type: ignore[attr-defined]
    try:
        yield stream, config
    finally:
        logging.config.dictConfig(settings.LOGGING)


def job_line(task: str, text: str) -> None:
    logging.getLogger("procrastinate.worker").info(
        text, extra={"action": "start_job", "job": {"id": 1, "task_name": task}}
    )


def test_the_sweeps_job_lines_are_debug_and_a_dispatchs_are_info(
    worker_log: tuple[io.StringIO, dict[str, Any]],
) -> None:
    stream, config = worker_log
    job_line("effect_broker.sweep", "Starting job effect_broker.sweep[1]()")
    job_line("effect_broker.remove_finished_jobs", "Starting job cleanup[2]()")
    job_line("effect_broker.dispatch_effect", "Starting job dispatch_effect[3]()")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "dispatch_effect[3]" in lines[0]
    # At DEBUG the sweep's lines are still there, marked DEBUG
    config["loggers"]["procrastinate"]["level"] = "DEBUG"
    logging.config.dictConfig(config)
    handler = logging.getLogger("procrastinate").handlers[0]
    handler.setStream(stream)  # type: ignore[attr-defined]
    job_line("effect_broker.sweep", "Starting job effect_broker.sweep[4]()")
    assert "sweep[4]" in stream.getvalue()
    assert "DEBUG" in stream.getvalue().splitlines()[-1]


def test_registering_the_apps_tasks_at_start_up_is_debug(
    worker_log: tuple[io.StringIO, dict[str, Any]],
) -> None:
    # Every process that loads the app logged these (six lines before `effect-broker
    # worker --help` printed its usage); a real job's line stays at INFO.
    stream, _ = worker_log
    logging.getLogger("procrastinate.periodic").info(
        "Registering task effect_broker.sweep with periodic id 'sweep'",
        extra={"action": "registering_periodic_task", "task": "effect_broker.sweep"},
    )
    logging.getLogger("procrastinate.blueprints").info(
        "Adding tasks from blueprint", extra={"action": "loading_blueprint"}
    )
    job_line("effect_broker.dispatch_effect", "Starting job dispatch_effect[5]()")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "dispatch_effect[5]" in lines[0]
