"""Arguments of the crash-matrix demo, shared by ``demo crash-matrix`` and
``crash_matrix`` so both spellings behave identically."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from django.core.management.base import CommandParser

from effect_broker.domain.errors import InvalidRequestError


class TextSink(Protocol):
    """Where the matrix prints: a text stream or a command's ``OutputWrapper``."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


def add_crash_matrix_arguments(parser: CommandParser) -> None:
    """Add the crash-matrix options to ``parser``."""
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--runs",
        type=int,
        default=0,
        help="after the matrix, N more effects under SIGKILLs at random moments",
    )
    parser.add_argument("--seed", type=int, default=42, help="seed for --runs")
    parser.add_argument(
        "--workers", type=int, default=3, help="worker processes in the pool (default 3)"
    )
    parser.add_argument(
        "--parallel", type=int, default=3, help="cells run at the same time (default 3)"
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="PATTERN",
        help=(
            "run only the cells named scenario/case that PATTERN matches (substring, "
            "or a glob with * ? [); repeat it or give a comma list"
        ),
    )
    parser.add_argument(
        "--png",
        type=Path,
        metavar="PATH",
        help="also draw the matrix (cells x broker/naive/agent-ledger) as a PNG here",
    )


def run_crash_matrix(out: TextSink, options: dict[str, Any]) -> int:
    """Validate options and run the matrix; return its exit code."""
    if options["runs"] < 0:
        raise InvalidRequestError("--runs must be >= 0")
    if not 1 <= options["workers"] <= 16:
        raise InvalidRequestError("--workers must be between 1 and 16")
    if not 1 <= options["parallel"] <= 16:
        raise InvalidRequestError("--parallel must be between 1 and 16")
    # Imported here: the demo lives in examples/ and needs the dev install.
    from examples.crash_matrix import plan
    from examples.crash_matrix.matrix import run_matrix
    from examples.crash_matrix.picture import matplotlib_missing

    only = plan.parse_only(options.get("only"))
    try:
        plan.select(plan.all_cells(), only)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc
    if options.get("png") is not None and (why := matplotlib_missing()):
        raise InvalidRequestError(f"--png: {why}")
    return run_matrix(
        out,
        workers=options["workers"],
        parallel=options["parallel"],
        runs=options["runs"],
        seed=options["seed"],
        json_path=options["json"],
        only=only,
        png_path=options.get("png"),
    )
