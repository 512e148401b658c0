"""Issue 12: the HTTP boundary under hostile input.

- No 5xx for any client input: a NUL in any field is 422 ``unstorable_text`` naming
  the field, from the one storable-text rule, and nothing is written.
- Every error is problem+json with a stable code: unknown routes, wrong methods (with
  ``Allow``), a bad Host, a missing or non-JSON Content-Type, unknown body fields,
  numeric underflow, oversized bodies, and 401 with ``WWW-Authenticate: Bearer``.
- No debug page reaches a client, whatever ``DEBUG`` says.

The body-size limit before the body is read, over real sockets, is in
tests/acceptance/test_api_server.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import User
from django.test import AsyncClient, Client, override_settings
from django.urls import reverse

from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.states import SafetyClass
from effect_broker.models import EffectEvent, EffectIntent, Tenant
from effect_broker.services import inspection, operators
from effect_broker.services.tenants import create_tenant
from tests.integration.engine.harness import Bench
from tests.integration.test_api_resolution import (
    PROOF,
    call,
    effect,
    resolve_body,
    state,
)

PROBLEM_JSON = "application/problem+json"
BODY: dict[str, Any] = {
    "operation_key": "order:7:charge:v1",
    "tool": "charge_card",
    "arguments": {"order": "7", "amount_minor": 1999, "currency": "EUR"},
}
NUL = "\x00"


@pytest.fixture
def api_key(db: None) -> str:
    return create_tenant("hostile-tenant")[1]


@pytest.fixture
def caller(bench: Bench) -> tuple[Tenant, str]:
    return create_tenant("hostile-ops")


@pytest.fixture
def op_token(operator: Any) -> str:
    return operators.create_token(operator.get_username())[1]


def auth(key: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def submit(client: Client, key: str | None, body: object, **extra: Any) -> Any:
    headers = auth(key) if key else {}
    return client.post(
        "/v1/effects", data=json.dumps(body), content_type="application/json",
        **headers, **extra,
    )  # fmt: skip


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == PROBLEM_JSON
    body = response.json()
    assert (body["status"], body["code"]) == (status, code)
    assert "Traceback" not in body["detail"]
    return body


def with_args(**arguments: object) -> dict[str, Any]:
    return {**BODY, "arguments": {**BODY["arguments"], **arguments}}


# --- NUL: 422 naming the field, nothing written ---------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "field"),
    [
        (with_args(**{f"note{NUL}": "x"}), "arguments"),  # a top-level argument key
        (with_args(currency=f"EU{NUL}R"), "arguments.currency"),  # a previewed value
        (with_args(memo={"lines": ["ok", NUL]}), "arguments.memo.lines[1]"),
        ({**BODY, "tool": f"charge_card{NUL}"}, "tool"),
        ({**BODY, "requested_by": f"agent{NUL}"}, "requested_by"),
        ({**BODY, "trace_id": f"t{NUL}"}, "trace_id"),
        ({**BODY, "operation_key": f"order:7{NUL}"}, "operation_key"),
    ],
    ids=[
        "argument-key",
        "previewed-value",
        "nested-value",
        "tool",
        "requested_by",
        "trace_id",
        "operation_key",
    ],
)
def test_nul_in_a_submit_field_is_422_naming_it_and_nothing_is_written(
    client: Client, api_key: str, body: dict[str, Any], field: str
) -> None:
    problem = assert_problem(submit(client, api_key, body), 422, "unstorable_text")
    assert problem["field"] == field
    assert "NUL (U+0000)" in problem["detail"]
    assert EffectIntent.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/effects?tool=charge%00card", "query.tool"),
        ("/v1/effects?operation_prefix=order%00", "query.operation_prefix"),
        ("/v1/effects?tool=a&tool=b%00", "query.tool[1]"),
        ("/v1/effects/01a241e3-63d5-7478-a28c-892322de103b%00", "path"),
        ("/v1/effects/%00/receipt", "path"),
    ],
    ids=["list-tool", "list-operation_prefix", "repeated-param", "effect-id", "receipt"],
)
def test_nul_in_a_query_filter_or_path_is_422_naming_it(
    client: Client, api_key: str, path: str, field: str
) -> None:
    problem = assert_problem(client.get(path, **auth(api_key)), 422, "unstorable_text")
    assert problem["field"] == field


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"reason": f"checked{NUL}"}, "reason"),
        ({"external_id": f"ch_{NUL}"}, "external_id"),
        ({"evidence": {**PROOF, "reference": f"ch{NUL}"}}, "evidence.reference"),
    ],
    ids=["reason", "external_id", "evidence"],
)
def test_nul_in_a_resolution_is_422_naming_it_and_the_effect_is_unchanged(
    client: Client,
    bench: Bench,
    caller: tuple[Tenant, str],
    op_token: str,
    extra: dict[str, Any],
    field: str,
) -> None:
    tenant, _ = caller
    record = effect(bench, tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    before, events = state(record), EffectEvent.objects.count()
    body = {**resolve_body("succeeded", evidence=PROOF), **extra}
    path = f"/v1/effects/{record.effect_id}/resolve"
    problem = assert_problem(
        call(client, "post", op_token, path, body), 422, "unstorable_text"
    )
    assert problem["field"] == field
    assert state(record) == before
    assert EffectEvent.objects.count() == events


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    ["q=order%00", "status__exact=prepared%00", "tool=charge%00", "o%00=1"],
    ids=["search", "status-filter", "tool-filter", "param-name"],
)
def test_nul_in_an_admin_list_filter_is_422_not_500(client: Client, query: str) -> None:
    User.objects.create_superuser("olga", "olga@example.invalid", "pw")
    client.force_login(User.objects.get(username="olga"))
    response = client.get(f"/admin/effect_broker/effectintent/?{query}")
    problem = assert_problem(response, 422, "unstorable_text")
    assert problem["field"].startswith("query")


# --- every error is problem+json -----------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/v1/nope", "/v1/effects/x/nope", "/nope", "/"])
def test_an_unknown_route_is_a_404_problem(client: Client, path: str) -> None:
    assert_problem(client.get(path), 404, "route_not_found")


@pytest.mark.django_db
def test_a_wrong_method_is_a_405_problem_with_allow(client: Client, api_key: str) -> None:
    response = client.delete("/v1/effects", **auth(api_key))
    assert_problem(response, 405, "method_not_allowed")
    assert sorted(m.strip() for m in response["Allow"].split(",")) == ["GET", "POST"]
    assert_problem(client.put("/healthz"), 405, "method_not_allowed")


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/healthz", "/v1/effects", "/admin/"])
def test_a_bad_host_is_a_400_problem_on_every_route(client: Client, path: str) -> None:
    response = client.get(path, HTTP_HOST="evil.example")
    problem = assert_problem(response, 400, "disallowed_host")
    assert "evil.example" not in problem["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "content_type", ["text/plain", "", "application/x-www-form-urlencoded"]
)
def test_a_body_not_sent_as_json_is_a_415_problem(
    client: Client, api_key: str, content_type: str
) -> None:
    response = client.generic(
        "POST", "/v1/effects", json.dumps(BODY), content_type, **auth(api_key)
    )
    assert_problem(response, 415, "unsupported_media_type")
    assert EffectIntent.objects.count() == 0


@pytest.mark.django_db
def test_a_json_media_type_with_parameters_is_accepted(
    client: Client, api_key: str
) -> None:
    response = client.generic(
        "POST",
        "/v1/effects",
        json.dumps(BODY),
        "application/json; charset=utf-8",
        **auth(api_key),
    )
    assert response.status_code == 202, response.content


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["tenant_id", "requestedby", "extra"])
def test_an_unknown_body_field_is_a_422_problem_naming_it(
    client: Client, api_key: str, field: str
) -> None:
    other = create_tenant("someone-else")[0]
    body = {**BODY, field: str(other.id)}
    problem = assert_problem(submit(client, api_key, body), 422, "unknown_field")
    assert problem["field"] == field
    assert EffectIntent.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("number", ["1e-400", "-2.5E-999"])
def test_numeric_underflow_is_refused_not_made_zero(
    client: Client, api_key: str, number: str
) -> None:
    raw = json.dumps(with_args(amount_minor=0)).replace(
        '"amount_minor": 0', f'"amount_minor": {number}'
    )
    response = client.post(
        "/v1/effects", data=raw, content_type="application/json", **auth(api_key)
    )
    assert_problem(response, 400, "number_out_of_range")
    assert EffectIntent.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "cap"),
    [("operation_key", 255), ("requested_by", 200), ("trace_id", 200)],
)
def test_over_long_identity_fields_are_422_and_the_cap_itself_is_accepted(
    client: Client, api_key: str, field: str, cap: int
) -> None:
    too_long = {**BODY, field: "k" * (cap + 1)}
    problem = assert_problem(submit(client, api_key, too_long), 422, "invalid_request")
    assert problem["field"] == field
    assert EffectIntent.objects.count() == 0
    assert submit(client, api_key, {**BODY, field: "k" * cap}).status_code == 202


@pytest.mark.django_db
def test_an_over_long_tool_name_is_422_and_not_echoed(
    client: Client, api_key: str
) -> None:
    problem = assert_problem(
        submit(client, api_key, {**BODY, "tool": "t" * 100_000}), 422, "invalid_request"
    )
    assert problem["field"] == "tool"
    assert len(json.dumps(problem)) < 1000


@pytest.mark.django_db
@override_settings(EFFECT_BROKER_MAX_BODY_BYTES=2000, DATA_UPLOAD_MAX_MEMORY_SIZE=2000)
def test_a_body_over_the_limit_that_reaches_django_is_a_413_problem(
    client: Client, api_key: str
) -> None:
    # Under ASGI the middleware refuses it first (acceptance test); this is the
    # fallback where Django itself reads the body (WSGI, the test client).
    response = submit(client, api_key, with_args(pad="x" * 3000))
    assert_problem(response, 413, "payload_too_large")
    assert EffectIntent.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "headers",
    [{}, {"HTTP_AUTHORIZATION": "Bearer eb_wrong"}, {"HTTP_AUTHORIZATION": "Basic x"}],
    ids=["none", "unknown-key", "wrong-scheme"],
)
def test_401_carries_www_authenticate_bearer(
    client: Client, headers: dict[str, Any]
) -> None:
    response = client.get("/v1/effects", **headers)
    assert_problem(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"] == "Bearer"


# --- DEBUG never shows a debug page --------------------------------------------------


@pytest.mark.django_db
@override_settings(DEBUG=True)
def test_with_debug_on_errors_are_still_problems_never_debug_pages(
    api_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client(raise_request_exception=False)
    assert_problem(client.get("/v1/nope"), 404, "route_not_found")
    bad_host = client.get("/v1/effects", HTTP_HOST="evil.example")
    assert_problem(bad_host, 400, "disallowed_host")
    assert b"Traceback" not in bad_host.content

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret detail from deep inside")

    monkeypatch.setattr(inspection, "list_effects", explode)
    failed = client.get("/v1/effects", **auth(api_key))
    problem = assert_problem(failed, 500, "internal_error")
    assert b"secret detail" not in failed.content
    assert problem["detail"] == "internal error; see server logs"


@override_settings(DEBUG=True)
def test_under_asgi_the_boundary_runs_async_with_the_same_answers() -> None:
    # AsyncClient goes through Django's ASGI handler: the middleware's async branch.
    # No route here reaches the database.
    client = AsyncClient(raise_request_exception=False)

    async def get(path: str, **headers: str) -> Any:
        return await client.get(path, headers=headers)

    assert_problem(async_to_sync(get)("/v1/nope"), 404, "route_not_found")
    bad_host = async_to_sync(get)("/healthz", host="evil.example")
    assert_problem(bad_host, 400, "disallowed_host")
    nul = async_to_sync(get)("/v1/effects?tool=a%00")
    assert assert_problem(nul, 422, "unstorable_text")["field"] == "query.tool"
    response = async_to_sync(client.delete)("/healthz")
    assert_problem(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET"


@pytest.mark.parametrize(
    "form",
    [
        {"evidence": '{"source": "dashboard", "reference": "ch\\u0000"}'},
        {"evidence": '{"source": "dashboard", "reference": "ch_9", "n\\u0000": 1}'},
        {"reason": "seen\x00", "evidence": '{"source": "d", "reference": "ch_9"}'},
        {"external_id": "ch\x00", "evidence": '{"source": "d", "reference": "ch_9"}'},
    ],
    ids=["evidence-value", "evidence-key", "reason", "external_id"],
)
def test_nul_in_the_admin_resolve_form_is_a_form_error_and_the_effect_is_unchanged(
    admin_client: Client, bench: Bench, form: dict[str, str]
) -> None:
    record = effect(bench, bench.tenant, SafetyClass.UNSAFE, Fault.LOSE_RESPONSE)
    before, events = state(record), EffectEvent.objects.count()
    url = reverse("admin:effect_broker_effectintent_resolve", args=[record.effect_id])
    response = admin_client.post(
        url, {"resolution": "succeeded", "reason": "seen", **form}
    )
    assert response.status_code == 200, response.content[:300]
    assert "errorlist" in response.content.decode()
    assert state(record) == before
    assert EffectEvent.objects.count() == events


# --- /docs and /openapi.json ----------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/openapi.json", "/docs"])
def test_api_docs_follow_the_access_setting(
    client: Client, admin_client: Client, path: str
) -> None:
    with override_settings(EFFECT_BROKER_API_DOCS="public"):
        assert client.get(path).status_code == 200
    with override_settings(EFFECT_BROKER_API_DOCS="staff"):
        anonymous = client.get(path)
        assert anonymous.status_code == 302
        assert anonymous["Location"].startswith("/admin/login/")
        assert admin_client.get(path).status_code == 200
    with override_settings(EFFECT_BROKER_API_DOCS="off"):
        assert_problem(client.get(path), 404, "route_not_found")
        assert_problem(admin_client.get(path), 404, "route_not_found")


def test_api_docs_are_off_by_default_in_production_only() -> None:
    script = "from django.conf import settings; print(settings.EFFECT_BROKER_API_DOCS)"
    base = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER")}
    base = {**base, "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "0"}
    production = {
        **base,
        "EFFECT_BROKER_ENV": "production",
        "DATABASE_URL": "postgres://u:p@127.0.0.1:1/x",
        "SECRET_KEY": "k" * 60,
        "EFFECT_BROKER_MASTER_KEY": base64.b64encode(b"m" * 32).decode(),
        "ALLOWED_HOSTS": "broker.example",
    }
    for env, expected in ((base, "public"), (production, "off")):
        done = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {script}"],
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == expected


@pytest.mark.django_db
def test_the_openapi_schema_declares_the_error_statuses_of_every_operation(
    client: Client,
) -> None:
    schema = client.get("/openapi.json").json()
    declared = {
        (method.upper(), path): set(op["responses"])
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    }
    every = {"400", "413", "422", "503"}
    assert declared[("POST", "/v1/effects")] == {
        "200", "202", "401", "403", "409", "415", "429", *every
    }  # fmt: skip
    assert declared[("POST", "/v1/effects/batch")] == {
        "200", "401", "403", "415", "429", *every
    }  # fmt: skip
    assert declared[("GET", "/v1/effects/{effect_id}")] == {"200", "401", "404", *every}
    assert declared[("POST", "/v1/effects/{effect_id}/resolve")] == {
        "200", "401", "403", "404", "409", "415", *every
    }  # fmt: skip
    assert declared[("GET", "/healthz")] == {"200", *every}
    for (method, path), statuses in declared.items():
        assert every <= statuses, (method, path)
        if path.startswith("/v1/"):
            assert "401" in statuses, (method, path)
    problem = schema["components"]["schemas"]["ProblemOut"]
    assert set(problem["required"]) == {"type", "title", "status", "code", "detail"}
    assert problem["examples"][0]["code"] == "unstorable_text"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("arguments", "cap"),
    [
        ({f"k{i}": i for i in range(1001)}, "keys"),
        ({"n": [[[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]]]}, "depth"),
        ({"memo": "m" * 65537}, "string_length"),
    ],
    ids=["keys", "depth", "string"],
)
def test_arguments_over_a_default_cap_are_422_and_nothing_is_written(
    client: Client, api_key: str, arguments: dict[str, Any], cap: str
) -> None:
    problem = assert_problem(
        submit(client, api_key, {**BODY, "arguments": arguments}),
        422,
        "arguments_too_large",
    )
    assert problem["cap"] == cap
    assert EffectIntent.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("debug", [False, True])
def test_too_many_query_parameters_is_a_400_problem_never_a_debug_page(
    debug: bool,
) -> None:
    client = Client(raise_request_exception=False)
    query = "&".join(f"p{i}=1" for i in range(1500))  # past Django's 1,000 fields
    with override_settings(DEBUG=debug):
        response = client.get(f"/v1/effects?{query}")
    problem = assert_problem(response, 400, "invalid_request")
    assert "Traceback" not in response.content.decode()
    assert problem["detail"] == "more than 1000 query parameters"
