"""Doctor checks about keys: retention against the retry horizon, and operation keys.

Two ways a deployment quietly loses the idempotency it thinks it has:

* **retries that outlive the target's key.** An idempotent target forgets a key
  after ``key_retention``. A retry sent later is a new charge, so the broker refuses
  it (``deadlines.within_key_retention``) and the effect goes to manual review. A
  contract whose own retry schedule can run past that horizon will send effects to
  an operator that a shorter schedule would have finished.
* **operation keys that defeat dedup.** A key generated per call (a fresh uuid4)
  is different on every retry of the same intent, so the broker sees new
  operations, not replays. A key that does not name its operation (``order:42``
  for both the charge and the refund) collides across tools.
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection

from effect_broker.domain.contracts import EffectContract
from effect_broker.domain.states import SafetyClass
from effect_broker.services.diagnosis import Check

_UUID = re.compile(
    r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.IGNORECASE
)
_HEX = re.compile(r"[0-9a-f]{16,}", re.IGNORECASE)
_TOKEN = re.compile(r"[A-Za-z0-9_\-]{20,}")
_SEPARATORS = re.compile(r"[:/|#.,;@= ]+")
_DIGITS = re.compile(r"\d+")
#: Examples shown per finding; keys are the caller's text, shown shortened.
_EXAMPLES = 3


def retry_horizon(contract: EffectContract) -> timedelta:
    """The longest time from the first send to the last retry this contract allows,
    plus the time it takes to notice a dead worker and hand its effect on.

    Attempts: each may take ``attempt_timeout`` (default: the lease). Between them:
    the backoff schedule. Recovery after a lost worker: its lease runs out, the
    sweeper notices (one sweep), a stalled job waits ``stalled_job_seconds``, and a
    due effect with no job is re-deferred after ``redefer_grace``. The broker also
    keeps ``retention_margin`` in hand before the key's end.
    """
    timing = settings.EFFECT_BROKER_TIMING
    lease = timedelta(seconds=timing["lease_seconds"])
    attempt = contract.attempt_timeout or lease
    backoffs = sum(
        (contract.backoff(n) for n in range(1, contract.retry_limit + 1)), timedelta()
    )
    recovery = timedelta(
        seconds=timing["lease_seconds"]
        + timing["sweep_seconds"]
        + timing["stalled_job_seconds"]
        + timing["redefer_grace_seconds"]
    )
    margin = timedelta(seconds=timing["retention_margin_seconds"])
    return attempt * (contract.retry_limit + 1) + backoffs + recovery + margin


def check_key_retention() -> Check:
    """Each idempotent contract's key retention against its retry horizon."""
    from effect_broker.services.contract_check import validate_file

    report = validate_file(settings.EFFECT_BROKER_CONTRACTS)
    if report.problems:
        return Check("key_retention", "skipped", "the contracts file is invalid")
    rows: list[dict[str, Any]] = []
    short: list[str] = []
    for contract in report.contracts:
        if (
            contract.safety is not SafetyClass.IDEMPOTENT
            or contract.key_retention is None
        ):
            continue
        horizon = retry_horizon(contract)
        fits = horizon <= contract.key_retention
        rows.append(
            {
                "contract": f"{contract.name}@{contract.version}",
                "tool": contract.tool,
                "retry_limit": contract.retry_limit,
                "key_retention_seconds": contract.key_retention.total_seconds(),
                "retry_horizon_seconds": horizon.total_seconds(),
                "fits": fits,
            }
        )
        if not fits:
            short.append(
                f"{contract.name}@{contract.version}: retries and recovery can take "
                f"{horizon.total_seconds():g}s but the target keeps keys for "
                f"{contract.key_retention.total_seconds():g}s"
            )
    if short:
        return Check(
            "key_retention",
            "warn",
            "retries could outlive the key (late ones go to manual review instead of "
            "being sent): " + "; ".join(short),
            tuple(rows),
        )
    if not rows:
        return Check("key_retention", "ok", "no idempotent contract")
    return Check(
        "key_retention",
        "ok",
        f"{len(rows)} idempotent contract(s): every retry fits inside the key's life",
        tuple(rows),
    )


def _random_segment(segment: str) -> bool:
    if _UUID.fullmatch(segment) or _HEX.fullmatch(segment):
        return True
    # A long token mixing cases and digits (base64/url-safe noise), not a word.
    return bool(
        _TOKEN.fullmatch(segment)
        and re.search(r"\d", segment)
        and re.search(r"[a-z]", segment)
        and re.search(r"[A-Z]", segment)
    )


def looks_random(key: str) -> bool:
    """True when nothing in ``key`` but noise identifies the operation: every part is
    random-looking or a bare word (``charge:9f1c…``), with no business identifier."""
    segments = [s for s in _SEPARATORS.split(key) if s]
    if not segments:
        return False
    noisy = [s for s in segments if _random_segment(s)]
    rest = [s for s in segments if not _random_segment(s)]
    return bool(noisy) and not any(_DIGITS.search(s) for s in rest)


def key_shape(key: str) -> str:
    """``key`` with identifiers blanked: ``order:42:charge`` -> ``order:#:charge``."""
    parts = _SEPARATORS.split(key)
    seps = _SEPARATORS.findall(key)
    shaped = ["<random>" if _random_segment(p) else _DIGITS.sub("#", p) for p in parts]
    out = shaped[0]
    for sep, part in zip(seps, shaped[1:], strict=False):
        out += sep + part
    return out


def names_an_operation(shape: str) -> bool:
    """True when a key shape has a word besides its leading entity name
    (``order:#:charge``), so keys of different tools with it still differ; false
    for ``order:#``, which the charge and the refund of one order would share."""
    words = [
        part
        for part in _SEPARATORS.split(shape)
        if part and part != "<random>" and any(c.isalpha() for c in part.replace("#", ""))
    ]
    return len(words) > 1


def _short(key: str) -> str:
    return key if len(key) <= 60 else key[:57] + "..."


def _fork_lineage(cur: Any, effect_ids: list[Any]) -> dict[Any, Any]:
    """Map each forked effect among ``effect_ids`` to the first effect of its chain."""
    if not effect_ids:
        return {}
    cur.execute(
        "SELECT old_effect_id, new_effect_id FROM effect_forks"
        " WHERE old_effect_id = ANY(%s) OR new_effect_id = ANY(%s)",
        [effect_ids, effect_ids],
    )
    parent = {new: old for old, new in cur.fetchall()}
    roots = {}
    for effect_id in parent:
        root = effect_id
        while root in parent:
            root = parent[root]
        roots[effect_id] = root
    return roots


def check_operation_keys(sample: int) -> Check:
    """Lint the newest ``sample`` effects' operation keys (per tenant)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT tenant_id, tool, operation_key, request_hash, id FROM effect_intents"
            " ORDER BY created_at DESC LIMIT %s",
            [sample],
        )
        found = cur.fetchall()
        rows = [row[:4] for row in found]
        lineage = _fork_lineage(cur, [row[4] for row in found])
    keys_by_id = {row[4]: row[2] for row in found}
    if not rows:
        return Check("operation_keys", "ok", "no effects to lint")
    findings: list[dict[str, Any]] = []
    random_keys = [(tool, key) for _t, tool, key, _h in rows if looks_random(key)]
    if random_keys:
        findings.append(
            {
                "finding": "random_keys",
                "count": len(random_keys),
                "tools": sorted({tool for tool, _ in random_keys}),
                "examples": [_short(k) for _, k in random_keys[:_EXAMPLES]],
                "why": "a key made fresh per call differs on every retry, so the "
                "broker cannot see a replay; derive it from the business intent "
                "(order:42:charge)",
            }
        )
    # An operator's fork carries its effect's arguments to a new key on purpose: one
    # intent, continued. Keys count as many intents only across separate lineages.
    same_arguments: dict[tuple[Any, str, bytes], set[str]] = defaultdict(set)
    lineages: dict[tuple[Any, str, bytes], set[Any]] = defaultdict(set)
    for tenant, tool, _key, request_hash, effect_id in found:
        group = (tenant, tool, bytes(request_hash))
        same_arguments[group].add(keys_by_id[effect_id])
        lineages[group].add(lineage.get(effect_id, effect_id))
    repeated = [
        (k[1], keys)
        for k, keys in same_arguments.items()
        if len(keys) > 1 and len(lineages[k]) > 1
    ]
    if repeated:
        findings.append(
            {
                "finding": "same_arguments_many_keys",
                "count": sum(len(keys) for _, keys in repeated),
                "tools": sorted({tool for tool, _ in repeated}),
                "examples": [_short(k) for _, keys in repeated[:1] for k in sorted(keys)][
                    :_EXAMPLES
                ],
                "why": "identical arguments were submitted under several keys; if "
                "they are one intent, each was performed separately",
            }
        )
    tools_by_shape: dict[tuple[Any, str], set[str]] = defaultdict(set)
    example_by_shape: dict[tuple[Any, str], list[str]] = defaultdict(list)
    for tenant, tool, key, _h in rows:
        shape = (tenant, key_shape(key))
        if tool not in tools_by_shape[shape]:
            example_by_shape[shape].append(key)
        tools_by_shape[shape].add(tool)
    shared = [
        (shape, tools)
        for shape, tools in tools_by_shape.items()
        if len(tools) > 1 and not names_an_operation(shape[1])
    ]
    if shared:
        findings.append(
            {
                "finding": "keys_shared_by_tools",
                "count": len(shared),
                "shapes": [
                    {"shape": shape[1], "tools": sorted(tools)} for shape, tools in shared
                ],
                "examples": [
                    _short(k) for shape, _ in shared[:1] for k in example_by_shape[shape]
                ][:_EXAMPLES],
                "why": "keys that name an entity but not the operation, used by "
                "several tools: the charge and the refund of one order get the same "
                "key, and the second tool's submit is refused as a conflict",
            }
        )
    if not findings:
        return Check("operation_keys", "ok", f"{len(rows)} recent key(s) look derived")
    summary = (
        "; ".join(f"{f['finding']}: {f['count']}" for f in findings)
        + f" (of {len(rows)} recent effects)"
    )
    return Check("operation_keys", "warn", summary, tuple(findings))
