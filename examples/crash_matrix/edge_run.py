"""``python -m examples.crash_matrix.edge_run``: the edge cells on a rig of their own.

Prints one line per cell as it finishes; ``--only TEXT`` runs the cells whose
"scenario case" contains TEXT (``|`` separates alternatives); ``--json FILE`` writes
every row with the facts its verdict was drawn from. Exits 1 if any cell fails.
Django is set up before the cells are imported (they import models).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run the edge cells; the exit code says whether every one passed."""
    parser = argparse.ArgumentParser(prog="edge_run", description=__doc__)
    parser.add_argument("--only", default="", help="e.g. 'frozen' or 'clock|operator'")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from examples.crash_matrix.cells import CellResult
    from examples.crash_matrix.edge_cells import edge_cells
    from examples.crash_matrix.rig import open_rig

    started = time.monotonic()
    wanted = [w for w in args.only.lower().split("|") if w]

    def only(scenario: str, case: str) -> bool:
        name = f"{scenario} {case}".lower()
        return not wanted or any(w in name for w in wanted)

    def say(result: CellResult) -> None:
        sys.stdout.write(
            f"{time.monotonic() - started:6.1f}s {result.scenario:<13} "
            f"{result.case:<32} -> {result.target_effects} charge(s), {result.status}"
            f"  {result.verdict} ({result.note})\n"
        )
        sys.stdout.flush()

    with open_rig() as rig:
        run = f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}"
        results = edge_cells(rig, run, say, only)
    failed = [r for r in results if r.verdict != "pass"]
    sys.stdout.write(
        f"edge cells: {len(results) - len(failed)} passed, {len(failed)} failed in "
        f"{time.monotonic() - started:.0f}s\n"
    )
    if args.json is not None:
        rows = [r.as_dict() for r in results]
        args.json.write_text(json.dumps(rows, indent=2, default=str), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
