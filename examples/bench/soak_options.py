"""The options of ``effect-broker bench --soak``: a long run with worker kills.

Importing this module is cheap (``effect-broker bench --help`` starts nothing).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from effect_broker.domain.errors import InvalidRequestError

#: Effects in a soak when ``--soak`` is given without a number.
DEFAULT_EFFECTS = 100_000


@dataclass(frozen=True)
class SoakOptions:
    """What one soak submits, how fast, and how often it kills a worker."""

    effects: int
    #: Submits per second the submitter aims for (open loop, paced).
    rate: float
    #: Effects per reported window (the target compares the last with the first).
    window: int
    #: Mean seconds between worker kills (each gap is uniform in 0.5x-1.5x this).
    kill_seconds: float
    #: Seeds the kill schedule, so two runs kill at the same moments.
    seed: int
    #: The submitter pauses while this many effects are submitted but not final, so a
    #: machine slower than ``rate`` measures a steady state, not an ever-longer queue.
    max_backlog: int

    def to_json(self) -> dict[str, Any]:
        """For the report."""
        return asdict(self)


def add_soak_arguments(parser: argparse.ArgumentParser) -> None:
    """The soak's options (``--soak`` alone runs only the soak)."""
    parser.add_argument(
        "--soak",
        type=int,
        nargs="?",
        const=DEFAULT_EFFECTS,
        metavar="N",
        help="run only a soak: N effects (default 100000) through 2 worker processes "
        "while one is SIGKILLed and restarted every few seconds; prints latency, table "
        "sizes and worker RSS per window, and the effects lost (must be 0)",
    )
    parser.add_argument(
        "--with-soak",
        type=int,
        nargs="?",
        const=DEFAULT_EFFECTS,
        metavar="N",
        help="run every phase, then a soak of N effects (default 100000) on a fresh "
        "scratch database, so one run's Targets table carries every row (about 27 "
        "minutes on 2 vCPUs at the default rate)",
    )
    parser.add_argument(
        "--soak-rate",
        type=float,
        default=80.0,
        metavar="PER_S",
        help="submits per second during a soak (default 80)",
    )
    parser.add_argument(
        "--soak-window",
        type=int,
        metavar="N",
        help="effects per reported window (default 10000, or N/10 for a smaller soak)",
    )
    parser.add_argument(
        "--soak-kill-seconds",
        type=float,
        default=20.0,
        metavar="S",
        help="mean seconds between worker kills (default 20; 0: never kill)",
    )
    parser.add_argument(
        "--soak-seed", type=int, default=13, metavar="N", help="seeds the kill schedule"
    )


def soak_from_cli(raw: dict[str, Any]) -> SoakOptions | None:
    """``SoakOptions`` when ``--soak`` or ``--with-soak`` was given;
    ``InvalidRequestError`` on bad input."""
    only, after = raw.get("soak"), raw.get("with_soak")
    if only is not None and after is not None:
        raise InvalidRequestError(
            "--soak (the soak alone) and --with-soak (every phase, then the soak) "
            "exclude each other"
        )
    flag, effects = ("--soak", only) if only is not None else ("--with-soak", after)
    if effects is None:
        return None
    if not 10 <= effects <= 10_000_000:
        raise InvalidRequestError(
            f"{flag} must be between 10 and 10000000, got {effects}"
        )
    rate = float(raw.get("soak_rate") or 80.0)
    if not 1 <= rate <= 10_000:
        raise InvalidRequestError(f"--soak-rate must be between 1 and 10000, got {rate}")
    window = raw.get("soak_window") or min(10_000, max(1, effects // 10))
    if not 1 <= window <= effects:
        raise InvalidRequestError(f"--soak-window must be between 1 and {effects}")
    kill = float(raw.get("soak_kill_seconds") or 0.0)
    if kill < 0:
        raise InvalidRequestError("--soak-kill-seconds must not be negative")
    return SoakOptions(
        effects=effects,
        rate=rate,
        window=window,
        kill_seconds=kill,
        seed=int(raw.get("soak_seed") or 0),
        max_backlog=max(100, int(rate * 20)),
    )
