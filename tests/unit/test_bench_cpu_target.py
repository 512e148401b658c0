"""The bench's "CPU per effect vs bare job" target row (issue 13): the ratio of the
sums, met at 2x or less, "not measured" when the drain did not run."""

from __future__ import annotations

from examples.bench.report import BenchResult, evaluate

ROW = "CPU per effect (worker + PostgreSQL) vs bare job"


def _row(cpu: dict[str, float]) -> tuple[str, bool | None]:
    result = BenchResult(started_at="", machine={}, server={}, where="", options={})
    result.cpu_per_item.update(cpu)
    (target,) = [t for t in evaluate(result) if t.name == ROW]
    return target.measured, target.met


def test_the_ratio_is_of_worker_plus_postgres_cpu() -> None:
    measured, met = _row(
        {
            "effect_worker_ms": 5.9,
            "effect_postgres_ms": 3.9,
            "job_worker_ms": 2.15,
            "job_postgres_ms": 1.27,
        }
    )
    assert measured == "2.87x"
    assert met is False
    measured, met = _row(
        {
            "effect_worker_ms": 3.0,
            "effect_postgres_ms": 1.0,
            "job_worker_ms": 1.5,
            "job_postgres_ms": 0.5,
        }
    )
    assert (measured, met) == ("2.00x", True)


def test_without_a_drain_the_row_is_not_measured() -> None:
    assert _row({}) == ("-", None)
