"""Prepared ledger statements, before and after (``effect_broker.store.prepared``).

One process, one scratch database, one Django connection; the two arms are the
setting ``EFFECT_BROKER_DB_PREPARED_STATEMENTS`` off (every statement bound on the
client, parsed and planned per call: Django's default) and on (the reservation and the
fenced compare-and-swap prepared on the server). Within a round the arms alternate
call by call, in a shuffled order, ``--calls`` calls of every case each, so the
machine's noise hits both. Reported: the median ms per call of each round, as a range
over the rounds, and the on/off ratio per round. Cases, called as the API and the
workers call them:

* new-key submit (``submit``: reserve + event + dispatch job, one statement);
* replay (``submit`` of a key taken: the same statement answers it);
* claim (``load_effect_for_worker`` + ``start_attempt``: a read and one fenced CAS);
* dispatch (``services.dispatch.dispatch`` to the in-process simulated target: the
  dispatch read, the claim CAS, the call, the outcome CAS).

Then the planning time EXPLAIN (ANALYZE) reports for the reservation and the claim
statement, each as bound on the client and as a prepared statement (after PostgreSQL's
five custom plans, its cached generic plan). Usage::

    python -m examples.bench.prepared_ab [--rounds 8] [--calls 200]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

CASES = ("new-key submit", "replay", "claim", "dispatch")
ARMS = (("client-bound (off)", False), ("prepared (on)", True))


@dataclass
class Samples:
    """Per round, the median seconds per call of each (arm, case)."""

    medians: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, arm: str, case: str, values: list[float]) -> None:
        self.medians.setdefault((arm, case), []).append(statistics.median(values))


class _Captured(Exception):
    """Raised by the capturing execute wrapper once it holds the statement."""


def capture(call: Callable[[], object]) -> tuple[str, list[Any]]:
    """The first ``WITH`` statement (a ledger write) ``call`` sends, and its params;
    that statement is not executed, the ones before it are."""
    from django.db import connection

    found: list[tuple[str, list[Any]]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().startswith("WITH"):
            found.append((sql, list(params)))
            raise _Captured
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper), contextlib.suppress(_Captured):
        call()
    if not found:
        raise RuntimeError("no ledger write was sent")
    return found[0]


def planning_ms(
    database_url: str, statements: list[tuple[str, list[Any]]]
) -> dict[str, list[float]]:
    """Planning time per EXPLAIN (ANALYZE) of each statement: bound on the client
    (literals, planned per call) and as ``EXECUTE`` of a ``PREPARE``d statement
    (the 6th call on uses the generic plan if PostgreSQL chose it)."""
    import psycopg
    from psycopg import sql as pgsql

    out: dict[str, list[float]] = {"client-bound": [], "prepared": [], "generic": []}
    with psycopg.connect(database_url, autocommit=True) as conn:
        client = psycopg.ClientCursor(conn)
        template = statements[0][0]
        counter = iter(range(1, 10_000))
        numbered = re.sub(r"%s", lambda _: f"${next(counter)}", template)
        conn.execute(f"PREPARE bench_ab AS {numbered}")
        for n, (statement, params) in enumerate(statements):
            assert statement == template
            explain = "EXPLAIN (ANALYZE, FORMAT JSON) "
            if n % 2 == 0:
                client.execute(explain + statement, params)
                row = client.fetchone()
                out["client-bound"].append(row[0][0]["Planning Time"] if row else 0.0)
            else:
                literals = pgsql.SQL(", ").join(pgsql.Literal(p) for p in params)
                query = pgsql.SQL(explain + "EXECUTE bench_ab ({})").format(literals)
                row = conn.execute(query).fetchone()
                out["prepared"].append(row[0][0]["Planning Time"] if row else 0.0)
        stats = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE name = 'bench_ab'"
        ).fetchone()
        out["generic"] = [float(stats[0]), float(stats[1])] if stats else []
        conn.execute("DEALLOCATE bench_ab")
    return out


#: How the reservation statement alone is sent, in ``statement_only``.
SENDS = ("client-bound", "server-bound, not prepared", "prepared")


def statement_only(
    database_url: str, statements: list[tuple[str, list[Any]]]
) -> dict[str, list[float]]:
    """The captured reservations (new keys) executed on a bare psycopg connection,
    the three ways of ``SENDS`` in turn: where the time a prepared statement saves
    comes from (client-side quoting, parse and analysis, planning). Seconds each."""
    import time

    import psycopg

    out: dict[str, list[float]] = {send: [] for send in SENDS}
    with psycopg.connect(database_url, autocommit=True) as conn:
        client = psycopg.ClientCursor(conn)
        server = conn.cursor()
        for n, (statement, params) in enumerate(statements):
            send = SENDS[n % len(SENDS)]
            t0 = time.perf_counter()
            if send == "client-bound":
                client.execute(statement, params)
                client.fetchall()
            else:
                server.execute(statement, params, prepare=send == "prepared")
                server.fetchall()
            out[send].append(time.perf_counter() - t0)
    return out


def server_plans() -> list[tuple[str, int, int]]:
    """This connection's prepared statements: (first words, generic, custom plans)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT left(regexp_replace(statement, '\\s+', ' ', 'g'), 60), "
            "generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE NOT from_sql ORDER BY name"
        )
        return [(str(r[0]), int(r[1]), int(r[2])) for r in cur.fetchall()]


def run_round(
    cases: Any, calls: int, serial: int, rng: random.Random
) -> dict[tuple[str, str], list[float]]:
    """``calls`` calls of every case in each arm, the arms alternating call by call
    in a shuffled order (so a burst of load elsewhere hits both); seconds per call."""
    import time

    from django.conf import settings

    from effect_broker.services import dispatch as dispatch_service

    # Untimed: the effects the replays, claims and dispatches act on.
    ready = {
        label: (
            [cases.submit_new_series(f"taken{k}", serial + i) for i in range(calls)],
            [cases.submit_new_series(f"claim{k}", serial + i) for i in range(calls)],
            [cases.submit_new_series(f"run{k}", serial + i) for i in range(calls)],
        )
        for k, (label, _) in enumerate(ARMS)
    }
    out: dict[tuple[str, str], list[float]] = {}
    clock = time.perf_counter
    for i in range(calls):
        arms = list(ARMS)
        rng.shuffle(arms)
        for label, on in arms:
            settings.EFFECT_BROKER_DB_PREPARED_STATEMENTS = on
            taken, to_claim, to_run = ready[label]
            t0 = clock()
            cases.submit_new_series(f"new-{label}", serial + i)
            t1 = clock()
            cases.submit_replay_of(taken[i])
            t2 = clock()
            cases.claim(to_claim[i])
            t3 = clock()
            dispatch_service.dispatch(to_run[i].effect_id, worker="bench-ab")
            t4 = clock()
            for case, spent in zip(
                CASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True
            ):
                out.setdefault((label, case), []).append(spent)
    return out


def table(samples: Samples) -> str:
    """Ranges over rounds of the per-round medians, and the on/off ratio per round."""
    off, on = ARMS[0][0], ARMS[1][0]
    lines = [
        "| case | off: ms per call (range over rounds) | on: ms per call "
        "| on / off (range over rounds) | saved ms (median) |",
        "|---|---:|---:|---:|---:|",
    ]
    for case in CASES:
        a, b = samples.medians[(off, case)], samples.medians[(on, case)]
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        saved = statistics.median(x - y for x, y in zip(a, b, strict=True))
        lines.append(
            f"| {case} | {min(a) * 1e3:.3f} - {max(a) * 1e3:.3f} "
            f"| {min(b) * 1e3:.3f} - {max(b) * 1e3:.3f} "
            f"| {min(ratios):.2f}x - {max(ratios):.2f}x | {saved * 1e3:.3f} |"
        )
    return "\n".join(lines)


def explain_lines(label: str, found: dict[str, list[float]]) -> list[str]:
    """One line per arm of the EXPLAIN planning times."""

    def span(values: list[float]) -> str:
        return (
            f"median {statistics.median(values):.3f} ms "
            f"(range {min(values):.3f} - {max(values):.3f}, n={len(values)})"
        )

    prepared = found["prepared"][5:]  # after the five custom plans
    generic = found["generic"]
    plans = (
        f"; generic plans {generic[0]:.0f}, custom {generic[1]:.0f}" if generic else ""
    )
    return [
        f"- {label}, client-bound: planning {span(found['client-bound'])}",
        f"- {label}, prepared (6th call on): planning {span(prepared)}{plans}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rounds; print the table and the planning times."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.bench.prepared_ab",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("--rounds", type=int, default=8, help="rounds (8)")
    parser.add_argument("--calls", type=int, default=200, help="calls per case (200)")
    parser.add_argument("--explains", type=int, default=40, help="EXPLAINs each (40)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings

    from effect_broker.domain.contracts import load_contracts
    from effect_broker.services import runtime
    from examples.bench.broker_cases import BrokerCases, bench_tenant
    from examples.bench.environment import SIMULATED_CONTRACT, scratch_database

    settings.DEBUG = False
    samples = Samples()
    rng = random.Random(13)  # noqa: S311 - the arms' order, not a secret
    with tempfile.TemporaryDirectory(prefix="eb-prepared-ab-") as workdir:
        contracts = Path(workdir) / "contracts.toml"
        contracts.write_text(SIMULATED_CONTRACT, encoding="utf-8")
        with scratch_database() as db:
            runtime.reset()
            with runtime.override(registry=load_contracts(contracts)):
                cases = BrokerCases(bench_tenant())
                run_round(cases, 50, 10_000_000, rng)  # warm-up, both arms
                for n in range(args.rounds):
                    found = run_round(cases, args.calls, (n + 2) * 10_000_000, rng)
                    for (label, case), values in found.items():
                        samples.add(label, case, values)
                    print(f"  round {n + 1}: done", file=sys.stderr, flush=True)
                plans = server_plans()
                settings.EFFECT_BROKER_DB_PREPARED_STATEMENTS = True
                reserves = [
                    capture(partial(cases.submit_new, 90_000_000 + i))
                    for i in range(args.explains)
                ]
                claims = [
                    capture(
                        partial(
                            cases.claim,
                            cases.submit_new_series("explain", 90_000_000 + i),
                        )
                    )
                    for i in range(args.explains)
                ]
                reserve_plan = planning_ms(db.url, reserves)
                claim_plan = planning_ms(db.url, claims)
                alone = statement_only(
                    db.url,
                    [
                        capture(partial(cases.submit_new, 95_000_000 + i))
                        for i in range(args.explains * 6)
                    ],
                )
            runtime.reset()
    print(table(samples))
    print()
    print("Planning time per EXPLAIN (ANALYZE), alternating client-bound and prepared:")
    print("\n".join(explain_lines("reservation (new key, with job)", reserve_plan)))
    print("\n".join(explain_lines("claim CAS (start_attempt)", claim_plan)))
    print()
    print("The reservation statement alone (new keys, bare psycopg, in turn):")
    for send in SENDS:
        values = alone[send][5:]  # the prepared one: after five custom plans
        print(
            f"- {send}: median {statistics.median(values) * 1e3:.3f} ms "
            f"(p25 {statistics.quantiles(values, n=4)[0] * 1e3:.3f}, "
            f"p75 {statistics.quantiles(values, n=4)[2] * 1e3:.3f}, n={len(values)})"
        )
    print()
    print("The bench connection's prepared statements (first words, generic, custom):")
    for text, generic, custom in plans:
        print(f"- `{text}…` generic {generic}, custom {custom}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
