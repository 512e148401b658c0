"""One worker process for the bench's A/B scripts (``wakeup_ab``, ``commits_ab``): an
arm names the module to run (the broker's CLI or a stock variant of its worker)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def one_worker(
    module: str, env: dict[str, str], database_url: str, *, name: str
) -> Iterator[int]:
    """One worker process (concurrency 1) started with ``python -m module``, ready
    (registered with procrastinate) when its pid is yielded; terminated on exit."""
    from examples.bench.environment import _registered_workers
    from examples.crash_matrix.workers import ROOT, wait_until

    before = _registered_workers(database_url)
    args = ["worker"] if module == "effect_broker.cli" else []
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args, "-n", name, "-c", "1"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:

            def ready() -> bool:
                if process.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"worker exited: {log.read()[-2000:]!r}")
                return _registered_workers(database_url) > before

            wait_until(ready, timeout=60, interval=0.1, what="the worker to start")
            yield process.pid
        finally:
            process.terminate()
            process.wait(timeout=30)
