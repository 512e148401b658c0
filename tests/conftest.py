"""Shared fixtures. Every database test runs on a real PostgreSQL server.

Which server is decided by config.database at settings import: DATABASE_URL when set,
EFFECT_BROKER_TEST_DB=docker for testcontainers, otherwise the embedded server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from config import database

# No per-example deadline: the suite runs on three processes on a 2-vCPU machine, where
# an example that takes 0.2 s alone can take 0.3 s, and Hypothesis then reports a
# correct property as flaky. Speed is measured by `effect-broker bench`, not by tests.
hypothesis_settings.register_profile("suite", deadline=None)
hypothesis_settings.load_profile("suite")


def pytest_report_header(config: pytest.Config) -> str:
    from django.conf import settings

    db = settings.DATABASES["default"]
    where = "DATABASE_URL" if db["ENGINE"].endswith("postgresql") else "embedded server"
    return f"effect-broker database: {where} host={db['HOST'] or 'localhost'}"


#: Tests that must run on one pytest-xdist worker, one after another (the scheduler
#: below; ``-n`` in pyproject's addopts); every other test is handed out on its own. Each
#: xdist worker has its own test database (pytest-django suffixes its name: ``_gw0``),
#: scratch databases are named by process id or a random suffix, servers take free
#: ports, and the tests that kill a PostgreSQL kill one of their own
#: (tests/acceptance/outage_stack.py, tests/integration/test_embedded_pg.py). What is
#: left is shared state under the checkout, and module fixtures too costly to repeat.
XDIST_GROUPS: dict[str, tuple[str, ...]] = {
    # ``effect-broker demo crash-matrix`` runs on an embedded server of its own under
    # the checkout (.effect-broker/crash-matrix), restarts it in its database-restart
    # cells and stops it when done: a second matrix run at the same moment would lose
    # its database mid-cell. The session's full run (tests/crash/conftest.py) and the
    # tests that read it share one worker; the CLI's one-cell runs
    # (tests/acceptance/test_crash_matrix_cli.py) use a state directory of their own.
    "crash-matrix": ("tests/crash/",),
    # ``effect-broker dev`` writes its contracts file under the checkout
    # (.effect-broker/dev), naming its own target's port.
    "dev": ("tests/acceptance/test_dev_command.py",),
}
#: Modules whose module-scoped fixture (a migrated scratch database, a server, a built
#: wheel, an embedded server of their own) would be set up again on every worker that
#: got one of their tests: each runs whole on one worker.
WHOLE_MODULES = (
    "tests/acceptance/test_api_database_unavailable.py",
    "tests/acceptance/test_api_server.py",
    "tests/acceptance/test_crash_matrix_cli.py",
    "tests/acceptance/test_dispatch_controls.py",
    "tests/acceptance/test_effects_cli.py",
    "tests/acceptance/test_runtime_recipes.py",
    "tests/acceptance/test_static_files.py",
    "tests/acceptance/test_wheel_layout.py",
    "tests/acceptance/test_worker_survives_db_restart.py",
    "tests/integration/test_client_live.py",
    "tests/integration/test_embedded_pg.py",
    "tests/integration/test_readme_integrations.py",
)
#: Started first: the longest group (about four minutes alone) would otherwise be
#: handed out last, since pytest-django orders tests without a database at the end.
FIRST = "crash-matrix"


def xdist_group_of(nodeid: str) -> str | None:
    """The xdist group a test belongs to, by its path; None to distribute it alone."""
    path = nodeid.split("::", 1)[0]
    for group, prefixes in XDIST_GROUPS.items():
        if path.startswith(prefixes):
            return group
    return path if path in WHOLE_MODULES else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Hand out each group of ``xdist_group_of`` to one worker, other tests one by one.

    Not ``--dist loadgroup``: it names a group by appending it to the node id, which
    pytest 9.2's node ids no longer allow (the mark is read and silently ignored).
    An explicit ``--dist`` other than the default is honoured.
    """
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid) or nodeid

    return GroupScheduling(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    reason = database.UNAVAILABLE_REASON
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if "django_db" in item.keywords:
                item.add_marker(skip)
    yield  # pytest-django orders the tests in here
    # The scheduler hands out work in this order (--no-loadscope-reorder). A stable
    # sort: pytest-django's order (database tests, then transactional ones, then the
    # rest) holds among all other tests.
    items.sort(key=lambda item: xdist_group_of(item.nodeid) != FIRST)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's test database, which it drops at the end of the session.

    Under xdist a worker's last test may have just stopped a server or worker process
    whose backend is still exiting, and ``DROP DATABASE`` refuses while any session
    is open: give those backends a few seconds, then end the stragglers.
    """
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        others = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        try:
            with connection.cursor() as cur:
                deadline = time.monotonic() + 10
                cur.execute(others)
                while cur.fetchone()[0] and time.monotonic() < deadline:
                    time.sleep(0.1)
                    cur.execute(others)
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
        finally:
            connection.close()


@pytest.fixture
def tenant(db: None):  # type: ignore[no-untyped-def]
    """A fresh enabled tenant."""
    from effect_broker.services.tenants import create_tenant

    return create_tenant("acme")[0]


@pytest.fixture
def other_tenant(db: None):  # type: ignore[no-untyped-def]
    """A second tenant, for isolation tests."""
    from effect_broker.services.tenants import create_tenant

    return create_tenant("globex")[0]


@pytest.fixture
def fresh_runtime() -> Iterator[None]:
    """Reset the cached runtime around a test that overrides it."""
    from effect_broker.services import runtime

    runtime.reset()
    yield
    runtime.reset()
