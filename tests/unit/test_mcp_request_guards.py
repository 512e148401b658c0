"""Which Origin values /mcp allows (effect_broker.mcp.request_guards, issue 19)."""

from __future__ import annotations

import pytest

from effect_broker.mcp.request_guards import LOOPBACK_ORIGINS, origin_allowed

ALLOWED = ("https://agents.example.com", "http://localhost:*")


@pytest.mark.parametrize(
    "origin",
    [
        "https://agents.example.com",
        "HTTPS://Agents.Example.com",
        "http://localhost:3000",
        "http://localhost:80",
    ],
)
def test_listed_origins_and_any_port_of_a_wildcard_are_allowed(origin: str) -> None:
    assert origin_allowed(origin, ALLOWED)


@pytest.mark.parametrize(
    "origin",
    [
        "http://agents.example.com",  # another scheme is another origin
        "https://agents.example.com:8443",  # another port too
        "https://agents.example.com.evil.example",
        "http://localhost.evil.example:3000",  # a rebinding name
        "http://localhost",  # the wildcard needs a port
        "http://localhost:3000x",
        "null",
        "",
    ],
)
def test_anything_else_is_refused(origin: str) -> None:
    assert not origin_allowed(origin, ALLOWED)


def test_nothing_is_allowed_when_nothing_is_listed() -> None:
    assert not origin_allowed("http://127.0.0.1:8000", ())
    assert origin_allowed("http://127.0.0.1:8000", LOOPBACK_ORIGINS)
    assert origin_allowed("http://[::1]:8000", LOOPBACK_ORIGINS)
