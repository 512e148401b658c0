"""``--png``: the matrix as a picture. One row per cell (safety class x fault), one
column per system under the same fault - the broker, the naive retry loop, agent-ledger
- each square showing that system's charges in the target's table, coloured by verdict.
matplotlib draws it off-screen (Agg), so it works on servers and CI.
"""

from __future__ import annotations

from pathlib import Path

from examples.crash_matrix.cells import CellResult
from examples.crash_matrix.report import LEDGER, baseline_kept

PASS, FAIL, UNKNOWN, NOT_RUN = "#5cb85c", "#d9534f", "#f0ad4e", "#e6e6e6"
COLUMNS = ("broker", "naive retry loop", LEDGER)


def matplotlib_missing() -> str | None:
    """Why no picture can be drawn, or None when matplotlib is importable."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[dev]')"
    return None


def _broker_square(r: CellResult) -> tuple[str, str]:
    if r.verdict == "skipped":
        return NOT_RUN, "skipped"
    if r.verdict != "pass":
        return FAIL, f"{r.target_effects}  FAIL"
    if r.status == "outcome_unknown":
        return UNKNOWN, f"{r.target_effects}  unknown"
    return PASS, str(r.target_effects)


def _baseline_square(
    scenario: str, effects: int | None, missing: str | None
) -> tuple[str, str]:
    kept = baseline_kept(scenario, effects)
    if kept is None:
        return NOT_RUN, "not installed" if missing else "-"
    return (PASS, str(effects)) if kept else (FAIL, str(effects))


def write_png(
    path: Path,
    results: list[CellResult],
    *,
    title: str,
    ledger_missing: str | None = None,
) -> None:
    """Draw ``results`` (in table order) to ``path`` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    rows = len(results)
    fig, ax = plt.subplots(figsize=(9.5, 0.27 * rows + 2.2))
    for y, r in enumerate(results):
        squares = [
            _broker_square(r),
            _baseline_square(r.scenario, r.naive_effects, None),
            _baseline_square(
                r.scenario,
                r.ledger_effects,
                ledger_missing if r.naive_effects is not None else None,
            ),
        ]
        for x, (colour, text) in enumerate(squares):
            ax.add_patch(
                Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="white", lw=1.5)
            )
            ax.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=7.5)
        if y and r.scenario != results[y - 1].scenario:
            ax.axhline(y, color="black", lw=1.2)
    ax.set_xlim(0, len(COLUMNS))
    ax.set_ylim(rows, 0)
    ax.set_xticks([x + 0.5 for x in range(len(COLUMNS))], COLUMNS, fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks(
        [y + 0.5 for y in range(rows)],
        [f"{r.scenario} / {r.case}" for r in results],
        fontsize=7.5,
    )
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.legend(
        handles=[
            Patch(color=PASS, label="kept the class's promise (target charges shown)"),
            Patch(color=UNKNOWN, label="broker: outcome_unknown, no resend (unsafe)"),
            Patch(color=FAIL, label="broke it (duplicate or lost charge)"),
            Patch(color=NOT_RUN, label="not run under this fault"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.4, 0.0),
        ncol=2,
        fontsize=7.5,
        frameon=False,
    )
    ax.set_title(title, fontsize=9, pad=24)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
