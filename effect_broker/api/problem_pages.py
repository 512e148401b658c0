"""``/problems/`` and ``/problems/{code}``: the pages a problem's ``type`` points at.

RFC 9457 asks that a problem type URI, when dereferenced, give human-readable
documentation for the problem. The broker serves it itself, from the same error
taxonomy the answers come from (``problems.catalogue``), so every code it can emit
has a page on every running broker and the two cannot drift. The docs site's error
reference (``docs/reference/errors.md``) is generated from the same source.

``/problems/`` also publishes the ``Idempotency-Key`` policy (how long a key is
remembered and what a reuse does), which submit answers link to (``rel=describedby``).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.html import escape

from effect_broker.api.idempotency_key import HEADER, MAX_HEADER_KEY_LENGTH
from effect_broker.api.problems import catalogue, problem
from effect_broker.domain.errors import MethodNotAllowedError, RouteNotFoundError

#: The key policy, as published (docs/reference/http-api.md says the same).
KEY_POLICY = (
    f"POST /v1/effects takes its operation key in the {HEADER} header (a quoted "
    f"string or a bare token, 1 to {MAX_HEADER_KEY_LENGTH} characters, one header) "
    "or in the body's operation_key. A key is remembered for as long as its effect "
    "exists, and the broker deletes no effect: a key never expires. Every later "
    "request with it is a replay (200, Idempotent-Replayed: true, the effect's "
    "current state; never a second effect), or, with other arguments, 422 "
    f"payload_conflict when the key came in {HEADER} (409 when it came in the body). "
    "A replay of an effect still being dispatched answers its current state at once; "
    "there is no 'still processing' refusal, because the request that reserved it "
    "finished when the intent was recorded. Two keys with the same arguments are "
    "two operations, never a conflict: two equal refunds may both be meant."
)

_STYLE = (
    "body{font:16px/1.5 system-ui,sans-serif;max-width:46em;margin:2em auto;"
    "padding:0 1em}code{background:#f3f3f3;padding:0 .2em}dt{margin-top:1em}"
)


def _page(title: str, body: str) -> HttpResponse:
    html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )
    response = HttpResponse(html, content_type="text/html; charset=utf-8")
    # The pages only change with the broker's version.
    response["Cache-Control"] = "public, max-age=3600"
    return response


def _entry(code: str, status: int, meaning: str, remedy: str) -> str:
    return (
        f'<dt id="{escape(code)}"><a href="/problems/{escape(code)}"><code>'
        f"{escape(code)}</code></a> (HTTP {status})</dt>"
        f"<dd><p>{escape(meaning)}</p><p><strong>What to do:</strong> "
        f"{escape(remedy)}</p></dd>"
    )


def _refuse_method(request: HttpRequest) -> HttpResponse | None:
    if request.method in ("GET", "HEAD"):
        return None
    refused = problem(405, MethodNotAllowedError.code, "these pages answer GET")
    refused["Allow"] = "GET, HEAD"
    return refused


def problem_index(request: HttpRequest) -> HttpResponse:
    """Every code the API can emit, each with its anchor, and the key policy."""
    if (refused := _refuse_method(request)) is not None:
        return refused
    entries = "".join(_entry(code, *facts) for code, facts in catalogue().items())
    return _page(
        "effect-broker problem types",
        "<h1>effect-broker problem types</h1><p>Every error is answered as "
        "<code>application/problem+json</code> whose <code>type</code> is one of "
        "these pages and whose <code>code</code> is stable.</p>"
        f'<h2 id="idempotency-key">{HEADER} and key expiry</h2>'
        f"<p>{escape(KEY_POLICY)}</p><h2>Codes</h2><dl>{entries}</dl>",
    )


def problem_page(request: HttpRequest, code: str) -> HttpResponse:
    """The page of one code: what it means and what to do."""
    if (refused := _refuse_method(request)) is not None:
        return refused
    facts = catalogue().get(code)
    if facts is None:
        return problem(404, RouteNotFoundError.code, "no such problem type")
    return _page(
        f"{code} - effect-broker problem type",
        f"<h1><code>{escape(code)}</code></h1><dl>{_entry(code, *facts)}</dl>"
        '<p><a href="/problems/">All problem types</a></p>',
    )
