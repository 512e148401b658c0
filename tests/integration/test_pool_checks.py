"""The workers' pool check (``effect_broker.store.pool_checks``) on real PostgreSQL.

A hot connection is lent without a round trip; one whose backend was terminated while
it sat in the pool (what a restart or crash does to every pooled connection) is
tested and replaced before anyone draws it, exactly as with psycopg_pool's check on
every checkout. Without a check the pool would lend the dead one: the first test shows
that this setup does catch the difference.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from config.database import url_from_settings
from effect_broker.store import pool_checks
from effect_broker.store.pool_checks import (
    check_when_in_doubt,
    check_when_in_doubt_async,
    needs_round_trip,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def url() -> str:
    connection.ensure_connection()
    return url_from_settings(connection.settings_dict)


@pytest.fixture
def admin(url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn


def _pool(url: str, check: Any) -> ConnectionPool[Any]:
    return ConnectionPool(
        url, min_size=1, max_size=1, open=True, check=check, kwargs={"autocommit": True}
    )


def _terminate(admin: psycopg.Connection[Any], pid: int) -> None:
    admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        if row and row[0] == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} did not exit")


def _lend_twice_and_kill(
    pool: ConnectionPool[Any], admin: psycopg.Connection[Any]
) -> int:
    """Use the pool's one connection twice (so it is hot), kill its backend while it
    is in the pool; return the dead backend's pid."""
    for _ in range(2):
        with pool.connection() as conn:
            pid = conn.info.backend_pid
    _terminate(admin, pid)
    return pid


def test_without_a_check_the_pool_lends_a_connection_killed_while_idle(
    url: str, admin: psycopg.Connection[Any]
) -> None:
    with _pool(url, None) as pool:
        _lend_twice_and_kill(pool, admin)
        with pytest.raises(psycopg.OperationalError), pool.connection() as conn:
            conn.execute("SELECT 1")


def test_a_connection_killed_while_idle_is_replaced_before_it_is_lent(
    url: str, admin: psycopg.Connection[Any]
) -> None:
    with _pool(url, check_when_in_doubt) as pool:
        dead = _lend_twice_and_kill(pool, admin)
        # Within IDLE_CHECK_SECONDS: only the socket can tell, and it does.
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.info.backend_pid != dead


def test_a_hot_connection_is_lent_without_a_round_trip(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        now = time.monotonic()
        assert needs_round_trip(conn, now)  # new to the check: tested
        assert not needs_round_trip(conn, now + 0.1)
        conn.execute("SELECT 1")  # used and answered: nothing left on the socket
        assert not needs_round_trip(conn, now + 0.2)


def test_a_connection_idle_for_long_is_tested(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        now = time.monotonic()
        needs_round_trip(conn, now)
        later = now + pool_checks.IDLE_CHECK_SECONDS + 0.1
        assert needs_round_trip(conn, later)


def test_a_connection_with_something_to_read_is_tested(
    url: str, admin: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN pool_checks_test")
        now = time.monotonic()
        needs_round_trip(conn, now)
        admin.execute("NOTIFY pool_checks_test")
        time.sleep(0.2)
        assert needs_round_trip(conn, now + 0.1)


def test_a_connection_in_a_transaction_is_tested(url: str) -> None:
    with psycopg.connect(url) as conn:  # not autocommit: a transaction stays open
        now = time.monotonic()
        needs_round_trip(conn, now)
        conn.execute("SELECT 1")
        assert needs_round_trip(conn, now + 0.1)


def test_procrastinates_pool_replaces_a_connection_killed_while_idle(
    url: str, admin: psycopg.Connection[Any]
) -> None:
    async def scenario() -> tuple[int, int]:
        async with AsyncConnectionPool(
            url,
            min_size=1,
            max_size=1,
            open=False,
            check=check_when_in_doubt_async,
            kwargs={"autocommit": True},
        ) as pool:
            for _ in range(2):
                async with pool.connection() as conn:
                    dead = conn.info.backend_pid
            await asyncio.to_thread(_terminate, admin, dead)
            async with pool.connection() as conn:
                await conn.execute("SELECT 1")
                return dead, conn.info.backend_pid

    dead, lent = asyncio.run(scenario())
    assert lent != dead


def test_the_worker_puts_the_check_on_djangos_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import connections

    monkeypatch.setitem(connections["default"].settings_dict, "OPTIONS", {})
    assert not pool_checks.use_on_django_pool()  # no pool: nothing to do
    pool = _pool(
        url_from_settings(connection.settings_dict), ConnectionPool.check_connection
    )
    with pool:
        monkeypatch.setattr(
            type(connections["default"]), "pool", property(lambda _: pool)
        )
        assert pool_checks.use_on_django_pool()
        assert pool._check is check_when_in_doubt


def test_procrastinates_worker_pool_runs_each_query_alone_in_autocommit(
    url: str, admin: psycopg.Connection[Any]
) -> None:
    """Issue 25: procrastinate's fetch and finish were BEGIN, the call, COMMIT - three
    round trips for one statement. The worker's pool is in autocommit instead, and
    procrastinate's LISTEN connection (opened with the pool's kwargs plus its own
    autocommit=True) still opens and hears a NOTIFY."""
    from procrastinate.contrib.django.utils import connector_params
    from psycopg.pq import TransactionStatus

    heard: asyncio.Queue[str] = asyncio.Queue()

    async def on_notification(*, channel: str, payload: str) -> None:
        await heard.put(payload)

    async def scenario() -> tuple[bool, TransactionStatus, str]:
        connector = pool_checks.procrastinate_connector(connector_params())
        await connector.open_async()
        try:
            async with connector.pool.connection() as conn:
                await conn.execute("SELECT 1")
                autocommit, status = conn.autocommit, conn.info.transaction_status
            listener = asyncio.create_task(
                connector.listen_notify(on_notification, ["pool_checks_autocommit"])
            )
            try:
                payload = ""
                deadline = time.monotonic() + 10
                while not payload and time.monotonic() < deadline:
                    # Until the LISTEN is in place, a NOTIFY reaches nobody: repeat.
                    await asyncio.to_thread(
                        admin.execute, "NOTIFY pool_checks_autocommit, 'heard'"
                    )
                    try:
                        payload = await asyncio.wait_for(heard.get(), 0.2)
                    except TimeoutError:
                        continue
            finally:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener
        finally:
            await connector.close_async()
        return autocommit, status, payload

    autocommit, status, payload = asyncio.run(scenario())
    assert autocommit is True
    # Nothing left open after the statement: no BEGIN was sent, no COMMIT is due.
    assert status is TransactionStatus.IDLE
    assert payload == "heard"
