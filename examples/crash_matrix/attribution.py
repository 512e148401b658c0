"""Which cell owns each charge in the target's table (issue 9, "Test target").

Every count the matrix makes is also a claim: a cell that counts its broker charges by
the effect's downstream key claims that key, a cell that counts by body claims that
body. After the run, every row of the target's table must belong to some claim. A row
that does not - a key the broker never sent, a body no cell sent, a charge a cell
forgot to count - is a charge the verdicts never saw, so the run fails on it.

A claim is as narrow as the count it stands for: a keyed broker charge is claimed by
its key only, so a charge committed with the cell's body under some other key is not
quietly attributed to the cell by its body.
"""

from __future__ import annotations

import threading
from typing import Any

from examples.crash_matrix.target_client import KEY_COLUMNS, Charge, body_digest


class ChargeClaims:
    """The keys and bodies the cells of one run counted (thread-safe)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str], str] = {}
        self._bodies: dict[tuple[str, bytes], str] = {}
        self._lock = threading.Lock()

    def claim_key(self, mode: str, key: str, owner: str) -> None:
        """Charges of keyed ``mode`` under downstream ``key`` belong to ``owner``."""
        if mode not in KEY_COLUMNS:
            raise ValueError(f"{mode} charges carry no key; claim them by body")
        with self._lock:
            self._keys[(mode, key)] = owner

    def claim_body(self, mode: str, body: dict[str, Any], owner: str) -> None:
        """Charges of ``mode`` whose body is exactly ``body`` belong to ``owner``."""
        with self._lock:
            self._bodies[(mode, body_digest(body))] = owner

    def owner(self, charge: Charge) -> str | None:
        """Who counted ``charge``, or None when no cell did."""
        with self._lock:
            if charge.key is not None and (charge.mode, charge.key) in self._keys:
                return self._keys[(charge.mode, charge.key)]
            return self._bodies.get((charge.mode, charge.body_hash))

    def unattributed(self, charges: list[Charge]) -> list[Charge]:
        """The charges no cell counted."""
        return [charge for charge in charges if self.owner(charge) is None]
