"""The cells of one crash-matrix run, and ``--only`` to pick some of them.

A cell is named ``scenario/case``, as its table row reads: ``idempotent/
after_target_commit``, ``unsafe/zombie worker``. ``--only`` takes patterns (repeated,
or comma-separated): a pattern with ``*``, ``?`` or ``[`` is a glob over the whole name,
any other pattern a substring; both ignore case. A pattern that is a cell's whole name
selects that cell only (``reconcilable/after_target_commit`` is not also
``mcp-reconcilable/after_target_commit``). A pattern that selects no cell is an
error, so a typo never runs an empty (green) matrix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from effect_broker.failpoints import FAILPOINTS

SCENARIOS = ["idempotent", "reconcilable", "transactional", "unsafe"]
#: The classes whose target is across a network (a zombie or a down target applies).
NETWORK = ["idempotent", "reconcilable", "unsafe"]
HEADLINE = ("idempotent", "after_target_commit")

KILL = "kill"
CONCURRENT = "10 concurrent submits"
ZOMBIE = "zombie worker"
TARGET_DOWN = "target down"
DB_RESTART = "postgres restart"
#: The database SIGKILLed while submits stream in (examples/crash_matrix/restart_cells).
DB_RESTART_LOAD = "postgres restart under load"
#: Issue 9's edge cells (examples/crash_matrix/edge_cells.py), run one after another.
EDGE = "edge"
#: Kills with the mcp adapter in front of the example payments MCP server (issue 10,
#: item 4); scenario ``mcp-<class>``, so ``--only 'mcp*'`` runs just these.
MCP_KILL = "mcp adapter kill"
MCP_PREFIX = "mcp-"
MCP_SCENARIOS = [f"{MCP_PREFIX}{s}" for s in ("idempotent", "reconcilable", "unsafe")]
#: The kills that matter for an adapter: the target committed, the receipt did not.
MCP_FAILPOINTS = ("after_target_commit", "before_receipt_commit")
#: Issue 23: a real runtime process SIGKILLed after the target committed, once
#: calling the target directly and once through the broker with the runtime's recipe
#: (examples/crash_matrix/runtime_cells.py); ``--only runtime`` runs just these.
RUNTIME_KILL = "runtime kill"
RUNTIME_PREFIX = "runtime-"
RUNTIMES = ("dbos", "langgraph", "celery", "temporal")
RUNTIME_SCENARIOS = [f"{RUNTIME_PREFIX}{r}" for r in RUNTIMES]
RUNTIME_CASE = "killed after target commit"
#: Issue 24's cells (examples/crash_matrix/approval_cells.py): scenario ``approval``,
#: so ``--only approval`` runs just these.
APPROVAL = "approval"
#: The worker's kill points after an operator's approval: each must leave one charge.
APPROVAL_KILLS = (
    "before_request_write",
    "after_target_commit",
    "before_receipt_commit",
    "after_receipt_commit",
)
APPROVED_KILLED = "approved then killed at {failpoint}"
REDELIVERED = "approved with the submit redelivered 3x"
DENIED = "denied"
EXPIRED = "expired"
CONCURRENT_APPROVALS = "concurrent approvals"
APPROVAL_CASES: list[str] = [
    *(APPROVED_KILLED.format(failpoint=fp) for fp in APPROVAL_KILLS),
    REDELIVERED,
    DENIED,
    EXPIRED,
    CONCURRENT_APPROVALS,
]


def safety_of(scenario: str) -> str:
    """The safety class a scenario is judged by (``mcp-unsafe`` -> ``unsafe``)."""
    return scenario.removeprefix(MCP_PREFIX)


FROZEN = "frozen between claim and send"
SLOW_COMMIT = "slow commit with lost answer"
IN_PROGRESS = "409 key in use after unknown"
TERMINAL = "400 terminal after unknown"
EXHAUSTED = "retries exhausted after unknown"
OPERATOR = "operator requeue refused then fork"
CLOCK_AHEAD = "one worker's clock +20s"
CLOCK_BEHIND = "one worker's clock -20s"
#: Issue 19, item 4: a worker frozen inside the write of its request.
FROZEN_MID_WRITE = "frozen between headers and body"
FROZEN_AFTER_GATE = "frozen after the send gate (fenced)"
#: The classes whose target can tell a late request from the takeover's.
WIRE_CLASSES = ("idempotent", "reconcilable")

EDGE_CASES: list[tuple[str, str]] = [
    *((scenario, FROZEN) for scenario in SCENARIOS),
    *((scenario, FROZEN_MID_WRITE) for scenario in WIRE_CLASSES),
    *((scenario, FROZEN_AFTER_GATE) for scenario in WIRE_CLASSES),
    ("reconcilable", SLOW_COMMIT),
    ("idempotent", IN_PROGRESS),
    ("idempotent", TERMINAL),
    ("idempotent", EXHAUSTED),
    ("unsafe", OPERATOR),
    ("idempotent", CLOCK_AHEAD),
    ("reconcilable", CLOCK_BEHIND),
]


@dataclass(frozen=True)
class CellId:
    """One planned cell: its kind (how it runs), its class and its case name."""

    kind: str
    scenario: str
    case: str

    @property
    def name(self) -> str:
        """``scenario/case``, what ``--only`` matches."""
        return f"{self.scenario}/{self.case}"


def all_cells() -> list[CellId]:
    """Every cell of a full run, in the order the table lists them."""
    cells = [CellId(KILL, s, fp) for s in SCENARIOS for fp in FAILPOINTS]
    cells += [CellId(CONCURRENT, s, CONCURRENT) for s in SCENARIOS]
    cells += [CellId(ZOMBIE, s, ZOMBIE) for s in NETWORK]
    cells += [CellId(TARGET_DOWN, s, TARGET_DOWN) for s in NETWORK]
    cells += [CellId(DB_RESTART, s, DB_RESTART) for s in SCENARIOS]
    cells += [CellId(DB_RESTART_LOAD, "idempotent", DB_RESTART_LOAD)]
    cells += [CellId(EDGE, s, case) for s, case in EDGE_CASES]
    cells += [CellId(MCP_KILL, s, fp) for s in MCP_SCENARIOS for fp in MCP_FAILPOINTS]
    cells += [CellId(RUNTIME_KILL, s, RUNTIME_CASE) for s in RUNTIME_SCENARIOS]
    cells += [CellId(APPROVAL, APPROVAL, case) for case in APPROVAL_CASES]
    return cells


def parse_only(values: Iterable[str] | None) -> list[str]:
    """``--only`` values (repeated and/or comma lists) as a flat list of patterns."""
    return [p.strip() for value in values or () for p in value.split(",") if p.strip()]


def matches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` (a glob if it has a wildcard, else a substring) selects."""
    pattern, name = pattern.lower(), name.lower()
    if any(c in pattern for c in "*?["):
        return fnmatchcase(name, pattern)
    return pattern in name


def select(cells: list[CellId], patterns: list[str]) -> list[CellId]:
    """The cells any pattern selects (all when there is none), in plan order.

    Raises ``ValueError`` naming the first pattern that selects nothing.
    """
    if not patterns:
        return list(cells)
    for pattern in patterns:
        if not any(matches(pattern, cell.name) for cell in cells):
            raise ValueError(
                f"--only {pattern!r} matches no cell; cells are named scenario/case, "
                f"scenarios {', '.join(dict.fromkeys(cell.scenario for cell in cells))}, "
                f"cases {', '.join(dict.fromkeys(cell.case for cell in cells))}"
            )
    names = {cell.name.lower() for cell in cells}

    def selects(pattern: str, name: str) -> bool:
        if pattern.lower() in names:  # a whole name means that one cell
            return pattern.lower() == name.lower()
        return matches(pattern, name)

    return [c for c in cells if any(selects(p, c.name) for p in patterns)]
