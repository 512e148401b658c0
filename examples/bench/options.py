"""Command-line options of ``effect-broker bench``, validated into ``BenchOptions``.

Importing this module is cheap (``effect-broker bench --help`` starts nothing).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from effect_broker.domain.errors import InvalidRequestError
from examples.bench.soak_options import SoakOptions, add_soak_arguments, soak_from_cli

DEFAULTS: dict[str, Any] = {
    "repetitions": 5,
    "samples": 200,
    "items": 200,
    "scale": "10k,1m",
    "http_levels": "1,8,32,256",
    "http_seconds": 3.0,
    "scale_out": "1x2,2x2,2x4",
    "serving_modes": "hops,httptools,wsgi",
}
QUICK: dict[str, Any] = {
    "repetitions": 2,
    "samples": 20,
    "items": 40,
    "scale": "10k",
    "http_levels": "1,8,256",
    "http_seconds": 1.0,
    "scale_out": "1x2,2x2",
    "serving_modes": "hops,httptools,wsgi",
}
#: Serving modes the HTTP phase can compare with the shipped one (http_servers).
SERVING_MODES = ("hops", "httptools", "wsgi")


@dataclass(frozen=True)
class BenchOptions:
    """What one run measures and where it writes."""

    quick: bool
    repetitions: int
    #: Throughput bursts per worker count (a burst costs seconds, not milliseconds).
    bursts: int
    samples: int
    warmup: int
    items: int
    workers: tuple[int, ...]
    scales: tuple[int, ...]
    reconcile_samples: int
    reconcilable_samples: int
    #: Concurrency levels of the HTTP phase; empty: no HTTP phase.
    http_levels: tuple[int, ...]
    #: Measurement window per HTTP level (seconds; end to end twice this).
    http_seconds: float
    json_path: Path | None
    png_path: Path | None
    #: End to end through the API: (API processes, worker processes) per run; always
    #: holds (1, 2), the target's figure.
    scale_out: tuple[tuple[int, int], ...] = ((1, 2),)
    #: Other ways of serving the API measured at the top level (``SERVING_MODES``).
    serving_modes: tuple[str, ...] = ()
    #: ``--soak`` / ``--with-soak``: the soak's options (examples/bench/soak.py).
    soak: SoakOptions | None = None
    #: ``--with-soak``: every phase, then the soak, in one report; with ``soak`` set
    #: and this False (``--soak``), the soak runs alone.
    with_soak: bool = False

    @property
    def soak_only(self) -> bool:
        """``--soak``: the soak alone, no other phase."""
        return self.soak is not None and not self.with_soak

    def to_json(self) -> dict[str, Any]:
        """For the report."""
        data = asdict(self)
        data["json_path"] = str(self.json_path) if self.json_path else None
        data["png_path"] = str(self.png_path) if self.png_path else None
        data["soak"] = self.soak.to_json() if self.soak else None
        return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench's options."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short smoke run: 2 repetitions x 20 calls, bursts of 40, the 10k ledger "
        "only (figures are indicative; publish a full run)",
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        metavar="N",
        help=f"repetitions of every case (default {DEFAULTS['repetitions']}, "
        f"--quick {QUICK['repetitions']})",
    )
    parser.add_argument(
        "--samples",
        type=int,
        metavar="N",
        help=f"timed calls per case and repetition (default {DEFAULTS['samples']}, "
        f"--quick {QUICK['samples']})",
    )
    parser.add_argument(
        "--items",
        type=int,
        metavar="N",
        help="effects / jobs per end-to-end throughput burst, up to 3 bursts per "
        "worker count "
        f"(default {DEFAULTS['items']}, --quick {QUICK['items']})",
    )
    parser.add_argument(
        "--workers",
        default="1,2,4",
        metavar="LIST",
        help="worker-process counts for end-to-end throughput (default 1,2,4)",
    )
    parser.add_argument(
        "--scale",
        metavar="LIST",
        help="ledger sizes for the scale figures, e.g. 10k,1m or 50k; 'none' skips them "
        f"(default {DEFAULTS['scale']}, --quick {QUICK['scale']})",
    )
    parser.add_argument(
        "--http-levels",
        metavar="LIST",
        help="concurrency levels of the HTTP phase (one uvicorn API process; end to "
        "end with 2 workers); 'none' skips it "
        f"(default {DEFAULTS['http_levels']}, --quick {QUICK['http_levels']})",
    )
    parser.add_argument(
        "--http-seconds",
        type=float,
        metavar="S",
        help="measurement window per HTTP level "
        f"(default {DEFAULTS['http_seconds']:g}, --quick {QUICK['http_seconds']:g})",
    )
    parser.add_argument(
        "--scale-out",
        metavar="LIST",
        help="end to end through the API with several API processes and workers "
        "against the one PostgreSQL, as APIxWORKERS (1x2 always runs) "
        f"(default {DEFAULTS['scale_out']}, --quick {QUICK['scale_out']})",
    )
    parser.add_argument(
        "--serving-modes",
        metavar="LIST",
        help="other ways of serving the API measured at the top HTTP level: hops "
        "(the ASGI path before issue 25), httptools (uvicorn's C parser, if "
        "installed), wsgi "
        "(serve --wsgi); 'none' skips them "
        f"(default {DEFAULTS['serving_modes']})",
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the results as JSON here"
    )
    parser.add_argument(
        "--png",
        type=Path,
        metavar="PATH",
        help="write the latency chart here (default: next to --json, same name .png)",
    )
    add_soak_arguments(parser)


def _int_list(text: str, what: str, low: int, high: int) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise InvalidRequestError(
            f"--{what} must be a comma-separated list of integers, got {text!r}"
        ) from None
    if not values or any(not low <= v <= high for v in values):
        raise InvalidRequestError(f"--{what} values must be between {low} and {high}")
    return values


def _bounded(name: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidRequestError(
            f"--{name} must be between {low} and {high}, got {value}"
        )
    return value


def _scale_out(text: str) -> tuple[tuple[int, int], ...]:
    """``1x2,2x2`` -> ((1, 2), (2, 2)), with (1, 2) always in; 'none': (1, 2) only."""
    pairs = {(1, 2)}
    text = text.strip().lower()
    if text not in {"none", ""}:
        for part in text.split(","):
            api, _, workers = part.strip().partition("x")
            try:
                pair = (int(api), int(workers))
            except ValueError:
                raise InvalidRequestError(
                    f"--scale-out must list APIxWORKERS pairs such as 2x2, got {part!r}"
                ) from None
            if not (1 <= pair[0] <= 8 and 1 <= pair[1] <= 16):
                raise InvalidRequestError(
                    "--scale-out: API processes must be 1-8 and workers 1-16"
                )
            pairs.add(pair)
    return tuple(sorted(pairs, key=lambda p: (p[1], p[0])))


def from_cli(raw: dict[str, Any]) -> BenchOptions:
    """Validate parsed arguments; raise ``InvalidRequestError`` with one clear line."""
    from examples.bench.scale import parse_scale

    base = QUICK if raw.get("quick") else DEFAULTS

    def number(name: str, high: int) -> int:
        value = raw.get(name)
        return _bounded(name, base[name] if value is None else value, 1, high)

    repetitions = number("repetitions", 100)
    samples = number("samples", 100_000)
    items = number("items", 100_000)
    workers = _int_list(raw.get("workers") or "1,2,4", "workers", 1, 16)
    scale_text = (raw.get("scale") or base["scale"]).strip().lower()
    scales: tuple[int, ...] = ()
    if scale_text not in {"none", "0", ""}:
        try:
            scales = tuple(sorted({parse_scale(p) for p in scale_text.split(",")}))
        except ValueError as exc:
            raise InvalidRequestError(f"--scale: {exc}") from None
    http_text = (raw.get("http_levels") or base["http_levels"]).strip().lower()
    http_levels = (
        ()
        if http_text in {"none", "0", ""}
        else _int_list(http_text, "http-levels", 1, 1024)
    )
    http_seconds = raw.get("http_seconds")
    http_seconds = base["http_seconds"] if http_seconds is None else http_seconds
    if not 0.1 <= http_seconds <= 30:
        raise InvalidRequestError(
            f"--http-seconds must be between 0.1 and 30, got {http_seconds:g}"
        )
    scale_out = _scale_out(raw.get("scale_out") or base["scale_out"])
    modes_text = (raw.get("serving_modes") or base["serving_modes"]).strip().lower()
    serving_modes: tuple[str, ...] = ()
    if modes_text not in {"none", ""}:
        serving_modes = tuple(dict.fromkeys(m.strip() for m in modes_text.split(",")))
        unknown = [m for m in serving_modes if m not in SERVING_MODES]
        if unknown:
            raise InvalidRequestError(
                f"--serving-modes: unknown {', '.join(unknown)}; choose from "
                f"{', '.join(SERVING_MODES)} or none"
            )
    json_path = raw.get("json")
    png_path = raw.get("png")
    if png_path is None and json_path is not None:
        png_path = Path(json_path).with_suffix(".png")
    for path in (json_path, png_path):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise InvalidRequestError(f"cannot write {path}: its folder does not exist")
    return BenchOptions(
        quick=bool(raw.get("quick")),
        repetitions=repetitions,
        bursts=min(repetitions, 3),
        samples=samples,
        warmup=max(3, min(50, samples // 5)),
        items=items,
        workers=workers,
        scales=scales,
        reconcile_samples=max(1, min(30, samples)),
        reconcilable_samples=max(1, min(5, samples // 4)),
        http_levels=http_levels,
        http_seconds=float(http_seconds),
        scale_out=scale_out,
        serving_modes=serving_modes if http_levels else (),
        json_path=Path(json_path) if json_path else None,
        png_path=Path(png_path) if png_path else None,
        soak=soak_from_cli(raw),
        with_soak=raw.get("with_soak") is not None,
    )
