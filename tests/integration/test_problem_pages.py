"""Problem types that resolve (issue 21): every code the API can emit has a page on
the broker at its problem's ``type``, and a section with its own anchor in the docs'
error reference, each saying what the code means and what to do."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings

from effect_broker.api.problems import catalogue, problem_document
from effect_broker.domain.errors import ERROR_CODES

DOCS_EXT = Path(__file__).resolve().parents[2] / "docs" / "_ext"


def test_every_code_the_api_can_emit_is_catalogued_with_what_to_do() -> None:
    codes = catalogue()
    # Every domain error, and the codes the surfaces answer themselves.
    assert set(ERROR_CODES) | {"internal_error", "http_error", "not_ready"} == set(codes)
    for code, cls in ERROR_CODES.items():
        # Its own remedy, not one inherited from a parent class.
        assert cls.__dict__.get("remedy"), code
    assert all(
        status >= 400 and meaning and remedy
        for status, meaning, remedy in (codes.values())
    )


@pytest.mark.django_db
def test_every_problem_type_resolves_to_its_page_on_the_broker(client: Client) -> None:
    for code, (status, meaning, remedy) in catalogue().items():
        uri = problem_document(status, code, "x")["type"]
        assert uri == f"/problems/{code}"
        page = client.get(uri)
        assert page.status_code == 200, code
        assert page["Content-Type"] == "text/html; charset=utf-8"
        text = html.unescape(page.content.decode())
        assert f'id="{code}"' in text
        assert meaning in text
        assert f"What to do:</strong> {remedy}" in text
    index = html.unescape(client.get("/problems/").content.decode())
    assert all(f'id="{code}"' in index for code in catalogue())
    assert 'id="idempotency-key"' in index
    assert "a key never expires" in index


@pytest.mark.django_db
def test_an_unknown_problem_type_is_a_404_problem(client: Client) -> None:
    response = client.get("/problems/no_such_code")
    assert response.status_code == 404
    assert response.json()["code"] == "route_not_found"


@override_settings(EFFECT_BROKER_PROBLEM_BASE_URL="https://docs.example.org/errors.html#")
def test_a_docs_base_url_makes_the_type_absolute() -> None:
    document = problem_document(409, "payload_conflict", "x")
    assert document["type"] == "https://docs.example.org/errors.html#payload_conflict"


def test_the_docs_error_reference_has_an_anchor_and_remedy_per_code() -> None:
    sys.path.insert(0, str(DOCS_EXT))
    try:
        from reference_pages import errors_markdown
    finally:
        sys.path.remove(str(DOCS_EXT))
    page = errors_markdown()
    for code, (status, _meaning, remedy) in catalogue().items():
        assert f'<span id="{code}"></span>' in page
        assert f"## `{code}` (HTTP {status})" in page
        assert f"**What to do:** {remedy}" in page


def test_every_code_literal_a_surface_answers_is_catalogued() -> None:
    # A code written out at a call site rather than taken from an error class (the
    # API's own handlers, /readyz, /metrics) must have its page too.
    source = Path(__file__).resolve().parents[2] / "effect_broker"
    call = re.compile(r"problem(?:_body)?\(\s*[\w.]+,\s*\"([a-z_]+)\"", re.S)
    found = {
        code
        for path in source.rglob("*.py")
        for code in call.findall(path.read_text(encoding="utf-8"))
    }
    assert {"internal_error", "http_error", "not_ready"} <= found
    assert found <= set(catalogue())
