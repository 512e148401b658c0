"""Django settings of bench worker processes: the project's settings, plus the module
holding the bare no-op task, so a worker can run the procrastinate floor's jobs.

procrastinate 3 only runs tasks whose module the worker imported; the broker's own
``tasks.py`` is found by autodiscovery, this one is named here.
"""

from config.settings import *  # noqa: F403

PROCRASTINATE_IMPORT_PATHS = ["examples.bench.noop_task"]
