"""The minimal shape of an operator's evidence, per resolution (defined once).

Spec "HTTP, CLI, and MCP surfaces": resolution attaches *proof*. A non-empty object was
enough before, so ``{"x": 1}`` could requeue a charge (issue 9, defect 5). The broker
cannot judge proof, but it can insist that the operator says where they looked
(``source``) and what they found there (``reference``), or when they checked a target
for the absence of the request (``checked_at``): an attestation that names its source
and time can be audited later; one that names nothing cannot.

Every surface (service, HTTP, CLI, admin) validates through ``check_evidence`` here,
so the rule and its messages exist once. Extra members are kept (and digested).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from effect_broker.domain.errors import InvalidRequestError

#: What each resolution's evidence must name: member -> what it means. ``fork`` is an
#: attestation of non-commit too, so it has the same shape as ``not_committed``.
EVIDENCE_SHAPES: dict[str, dict[str, str]] = {
    "succeeded": {
        "source": "where the success was seen (e.g. 'stripe dashboard')",
        "reference": "the target's record of it (e.g. a charge or ticket id)",
    },
    "not_committed": {
        "source": "where the absence was checked (e.g. 'stripe charges export')",
        "checked_at": "when it was checked (ISO-8601 time with a UTC offset)",
    },
    "fork": {
        "source": "where the absence was checked (e.g. 'stripe charges export')",
        "checked_at": "when it was checked (ISO-8601 time with a UTC offset)",
    },
    # Giving up needs no proof; if evidence is given it must say where it came from.
    "failed": {"source": "where the evidence comes from"},
}

#: What the evidence of each resolution proves (for messages).
_PROOF_OF = {
    "succeeded": "proof of success",
    "not_committed": "proof of non-commit",
    "fork": "proof of non-commit",
    "failed": "evidence",
}

#: Resolutions whose evidence may be left out entirely.
EVIDENCE_OPTIONAL: frozenset[str] = frozenset({"failed"})


def check_evidence(kind: str, evidence: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return ``evidence`` as a dict if it has ``kind``'s shape, else raise
    ``InvalidRequestError`` naming the first missing or malformed member."""
    shape = EVIDENCE_SHAPES[kind]
    if evidence is None or (isinstance(evidence, Mapping) and not evidence):
        if kind in EVIDENCE_OPTIONAL:
            return {}
        raise InvalidRequestError(
            f"{_PROOF_OF[kind]} is required for {kind}: attach evidence as a JSON "
            "object with "
            + ", ".join(f"'{member}' ({what})" for member, what in shape.items()),
            missing=",".join(shape),
        )
    if not isinstance(evidence, Mapping):
        raise InvalidRequestError("evidence must be a JSON object")
    document = dict(evidence)
    for member, what in shape.items():
        value = document.get(member)
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequestError(
                f"evidence for {kind} needs '{member}': {what} (a non-empty string)",
                missing=member,
            )
    if "checked_at" in shape:
        _aware_time(document["checked_at"], kind=kind)
    return document


def _aware_time(value: str, *, kind: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise InvalidRequestError(
            f"evidence for {kind} needs 'checked_at' as an ISO-8601 time with a UTC "
            f"offset (e.g. 2026-12-03T21:00:00Z), got {value!r}",
            missing="checked_at",
        )
    return parsed
