"""Output shared by the operations commands: aligned tables for people, JSON for tools."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def render_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns, two spaces apart, header first (``ls -l`` style)."""
    lines = [[str(cell) for cell in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) for cell, width in zip(line, widths, strict=True)
        ).rstrip()
        for line in lines
    )


def to_json(value: Any) -> str:
    """Stable, readable JSON (sorted keys; datetimes and the like as strings)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)
