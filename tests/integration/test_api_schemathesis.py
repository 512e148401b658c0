"""Schemathesis over the whole HTTP API (issue 12, item 4): ``uvicorn
config.asgi:application`` on the test database, real tenants with real effects in
every interesting state, and cases generated from the API's own OpenAPI schema
(``/openapi.json``), valid and invalid, each sent over real HTTP and checked with
schemathesis's checks: no 5xx, every status and header declared, every body of the
declared media type and schema.

Generation is seeded (Hypothesis ``derandomize``), so a run is repeatable: a failure
here is a failure on every run until it is fixed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from effect_broker.adapters.simulated_adapter import (
    Fault,
    SimulatedAdapter,
    SimulatedTarget,
)
from effect_broker.domain.records import EffectRequest
from effect_broker.domain.waits import MAX_WAIT_SECONDS
from effect_broker.services import runtime
from effect_broker.services.dispatch import dispatch
from effect_broker.services.operators import create_token
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from tests.integration.conftest import make_operator
from tests.integration.mcp_support import World
from tests.integration.test_mcp_mounted import api_server

pytestmark = [pytest.mark.django_db(transaction=True)]

#: Cases per operation and generation mode, at most (Hypothesis stops early on an
#: operation whose inputs run out: /healthz has none).
EXAMPLES = 75
MINIMUM_CASES = 1_000


def _target(tool: str) -> SimulatedTarget:
    """The simulated target ``tool``'s adapter sends to: adapters are built once per
    process (``adapters.registry``), so this one, not a fresh ``get_target``, is the
    target an in-process ``dispatch`` reaches after an earlier test reset targets."""
    rt = runtime.get_runtime()
    adapter = rt.adapter_for(rt.registry.for_tool(tool))
    assert isinstance(adapter, SimulatedAdapter)
    return adapter.target


@dataclass
class Ledger:
    """Who calls, and which real effects a generated id is sometimes replaced by."""

    api_key: str
    operator_token: str
    effect_ids: list[str]
    tools: list[str]
    cases: int = 0
    per_operation: dict[str, int] = field(default_factory=dict)
    exempted: dict[str, int] = field(default_factory=dict)
    by_status: dict[int, int] = field(default_factory=dict)

    def count(self, label: str) -> None:
        self.cases += 1
        self.per_operation[label] = self.per_operation.get(label, 0) + 1

    def exempt(self, what: str) -> None:
        self.exempted[what] = self.exempted.get(what, 0) + 1


def _effects(world: World) -> list[str]:
    """Effects of ``world``'s tenant in every state a route answers differently for:
    reserved, succeeded (with a receipt), outcome_unknown (unsafe, waits for an
    operator), and one of another tenant (reads as not found)."""
    tenant = world.tenant
    ids = []

    def effect(tool: str, key: str) -> str:
        request = EffectRequest(
            operation_key=key, tool=tool, arguments={"order": "42", "amount_minor": 5}
        )
        return submit(tenant, request).effect.effect_id

    ids.append(effect("charge_idempotent", "schemathesis:reserved"))
    for n in range(3):
        succeeded = effect("charge_idempotent", f"schemathesis:succeeded:{n}")
        dispatch(succeeded, worker="test")
        ids.append(succeeded)
    _target("charge_unsafe").inject(Fault.LOSE_RESPONSE)
    for n in range(4):
        unknown = effect("charge_unsafe", f"schemathesis:unknown:{n}")
        dispatch(unknown, worker="test")
        ids.append(unknown)
        _target("charge_unsafe").inject(Fault.LOSE_RESPONSE)
    other, _ = create_tenant(f"other-{uuid.uuid4().hex[:6]}")
    ids.append(
        submit(
            other,
            EffectRequest(operation_key="theirs", tool="charge_unsafe", arguments={}),
        ).effect.effect_id
    )
    return ids


@pytest.fixture
def ledger(mcp_world: World) -> Iterator[tuple[Ledger, str]]:
    ids = _effects(mcp_world)
    make_operator("schemathesis-operator")
    _, token = create_token("schemathesis-operator")
    tools = ["charge_idempotent", "charge_unsafe", "refund_card"]
    # No worker runs here, so readiness would rightly answer 503 "no live worker":
    # its worker check is off for this server (tests/integration/test_readiness.py
    # covers it); every other 5xx still fails the run.
    ready = {**mcp_world.env, "EFFECT_BROKER_READY_WORKER_SECONDS": "0"}
    with api_server(replace(mcp_world, env=ready)) as base:
        yield Ledger(mcp_world.api_key, token, ids, tools), base


def _credentials(path: str, ledger: Ledger) -> dict[str, str] | None:
    """The route surface's credentials, given to schemathesis as the caller's own:
    never mutated by negative generation, while its auth check still sends the
    request without them and expects a 401."""
    if not path.startswith("/v1/"):
        return None
    operator = path.endswith(("/resolve", "/fork")) or path.startswith("/v1/operator/")
    token = ledger.operator_token if operator else ledger.api_key
    return {"Authorization": f"Bearer {token}"}


def _semantic_refusal(case: Any, response: Any) -> bool:
    """A refusal of schema-valid input for a reason no static schema can state: the
    deployment's contracts, one effect's chain length, the evidence a resolution
    needs. These, and only these, are exempt from "valid data is accepted"; every
    other check (declared status, media type, body schema, no 5xx) still applies."""
    if response.status_code not in (400, 422):
        return False
    try:
        problem = response.json()
    except ValueError:
        return False
    code = problem.get("code")
    label = case.operation.label
    if code in ("number_out_of_range", "unstorable_text"):
        # Rules for every value anywhere in a body (the API's description states
        # them): numbers within +-(2**53-1), no NUL in any text. A free-form object
        # (``arguments``, ``evidence``) cannot carry them in its schema.
        return True
    if code == "invalid_request" and problem.get("field") == "operation_key":
        # Printable characters only (str.isprintable: Unicode categories, which no
        # portable JSON Schema pattern can name); the field's description says so.
        return True
    if label == "POST /v1/effects":
        # ``tool`` must name an active contract of this deployment; a key sent both
        # ways must be one key (header and body: no schema relates the two); and a
        # key sent as Idempotency-Key that an earlier case reserved with other
        # arguments is the draft's 422 (the state-dependent refusal the body's key
        # answers with 409, which the check already counts as no rejection).
        return (
            code == "unknown_contract"
            or (code == "payload_conflict" and response.status_code == 422)
            or (
                code == "invalid_request"
                and problem.get("field") == "Idempotency-Key"
                and "different operations" in str(problem.get("detail"))
            )
        )
    if label == "POST /v1/effects/batch":
        # The same rule for each item (the problem's ``item`` names which).
        return code == "unknown_contract" and isinstance(problem.get("item"), int)
    if label == "GET /v1/effects/{effect_id}/history":
        # ``at_sequence`` past this effect's last event (0 and below the schema
        # refuses itself).
        asked = (case.query or {}).get("at_sequence")
        return (
            code == "invalid_request"
            and isinstance(asked, int)
            and asked > int(problem.get("latest_sequence", asked))
        )
    if label == "POST /v1/operator/pauses":
        # A pause names a tool, contract or tenant of this deployment (a typo would
        # pause nothing), and at least one of them (issue 24).
        return code in ("unknown_contract", "invalid_request")
    if label.endswith(("/resolve", "/fork")):
        # The evidence a resolution needs depends on the resolution; its problem
        # names the ``missing`` member (effect_broker.domain.evidence).
        return code == "invalid_request" and "missing" in problem
    return False


def _prepare(case: Any, effect_id: str | None, tool: str | None) -> None:
    """Sometimes a real effect id or tool in place of the generated one."""
    if effect_id is not None and "effect_id" in (case.path_parameters or {}):
        case.path_parameters["effect_id"] = effect_id
    if tool is not None and isinstance(case.body, dict) and "tool" in case.body:
        case.body["tool"] = tool
    if tool is not None and isinstance(case.body, dict):
        # A batch's items (POST /v1/effects/batch), so some batches are reserved.
        for item in case.body.get("items") or []:
            if isinstance(item, dict) and "tool" in item:
                item["tool"] = tool


#: What a generated long-poll waits at most here (``GET /v1/effects/{id}/wait``).
POLL_SECONDS = 0.05


def _bound_the_wait(case: Any) -> None:
    """A long-poll's ``timeout`` cut to ``POLL_SECONDS`` where it is valid (0 to
    25 s) or left out (25 s by default): the effects waiting for an operator never
    settle here, and 150 cases each waiting up to 25 s would take the run's time. A
    shorter valid timeout keeps a valid case valid and an invalid one invalid (an
    invalid value is left as generated)."""
    if not case.operation.path.endswith("/wait"):
        return
    if case.query is None:
        case.query = {}
    if not isinstance(case.query, dict):
        return
    timeout = case.query.get("timeout", MAX_WAIT_SECONDS)
    if (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and 0 <= timeout <= MAX_WAIT_SECONDS
    ):
        case.query["timeout"] = min(timeout, POLL_SECONDS)


def _fuzz(
    operation: Any, mode: GenerationMode, state: Ledger, base: str, session: Any
) -> None:
    """Run ``operation``'s generated cases of ``mode``; raise on the first failure."""

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=operation.as_strategy(
            generation_mode=mode, headers=_credentials(operation.path, state)
        ),
        effect_id=st.none() | st.sampled_from(state.effect_ids),
        tool=st.none() | st.sampled_from(state.tools),
    )
    def run(case: Any, effect_id: str | None, tool: str | None) -> None:
        if mode is GenerationMode.POSITIVE:
            # A negative case stays as generated: a real id or tool in place of the
            # part made invalid would make it a valid request.
            _prepare(case, effect_id, tool)
        _bound_the_wait(case)
        if _credentials(operation.path, state) is not None:
            # The credentials are the caller's own, not generated. schemathesis infers
            # that only for an operation without header parameters of its own; POST
            # /v1/effects declares Idempotency-Key (issue 21), and its auth check then
            # took the real key for a generated one. Said explicitly, the check probes
            # the request without credentials and with invalid ones, expecting 401.
            case._has_explicit_auth = True
        state.count(operation.label)
        response = case.call(base_url=base, session=session)
        exempt = mode is GenerationMode.POSITIVE and _semantic_refusal(case, response)
        if exempt:
            state.exempt(f"{operation.label} {response.json()['code']}")
        case.validate_response(
            response, excluded_checks=[positive_data_acceptance] if exempt else None
        )
        state.by_status[response.status_code] = (
            state.by_status.get(response.status_code, 0) + 1
        )

    run()


def test_generated_requests_find_no_5xx_and_no_schema_violation(
    ledger: tuple[Ledger, str],
) -> None:
    state, base = ledger
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    session = requests.Session()
    operations = [result.ok() for result in schema.get_all_operations()]
    failures: list[str] = []
    started = time.monotonic()

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, state, base, session)
            except Unsatisfiable:
                # No input of this operation can be made invalid (/healthz has none).
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # schemathesis raises a BaseExceptionGroup
                failures.append(f"{operation.label} [{mode.value}]: {exc!r}")

    elapsed = time.monotonic() - started
    print(
        f"\nschemathesis: {state.cases} cases over {len(operations)} operations in "
        f"{elapsed:.1f}s; statuses {dict(sorted(state.by_status.items()))}; "
        f"per operation {state.per_operation}; semantic refusals {state.exempted}"
    )
    assert not failures, "\n\n".join(failures)
    assert state.cases >= MINIMUM_CASES
    assert not any(status >= 500 for status in state.by_status)


def test_the_run_exercises_real_effects_not_only_404s(ledger: tuple[Ledger, str]) -> None:
    # A sanity check on the set-up the generated cases lean on: with the keys and ids
    # given to them, the API answers with real effects, receipts and operator routes.
    state, base = ledger
    tenant = {"Authorization": f"Bearer {state.api_key}"}
    listed = requests.get(f"{base}/v1/effects", headers=tenant, timeout=10)
    assert listed.status_code == 200
    assert len(listed.json()) == len(state.effect_ids) - 1  # one is another tenant's
    receipt = requests.get(
        f"{base}/v1/effects/{state.effect_ids[1]}/receipt", headers=tenant, timeout=10
    )
    assert receipt.status_code == 200
    theirs = requests.get(
        f"{base}/v1/effects/{state.effect_ids[-1]}", headers=tenant, timeout=10
    )
    assert theirs.status_code == 404
    operator = {"Authorization": f"Bearer {state.operator_token}"}
    resolved = requests.post(
        f"{base}/v1/effects/{state.effect_ids[4]}/resolve",
        headers=operator,
        json={"resolution": "failed", "reason": "checked with the card network"},
        timeout=10,
    )
    assert resolved.status_code == 200, resolved.text
    assert resolved.json()["status"] == "failed_final"
