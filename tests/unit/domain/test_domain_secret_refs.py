"""SecretRef in the domain: the shape of a reference, finding and resolving them."""

from __future__ import annotations

import pytest

from effect_broker.domain.errors import InvalidSecretRefError, SecretRefNotDeclaredError
from effect_broker.domain.payload_crypto import HIDDEN_FIELDS, redacted_preview
from effect_broker.domain.secret_refs import (
    SecretRef,
    find_refs,
    refuse_undeclared,
    resolve_refs,
)


def test_references_are_found_at_any_depth_with_their_field() -> None:
    arguments = {
        "api_key": {"$secret": "env:STRIPE_KEY"},
        "card": {"token": {"$secret": "file:card-token.txt"}},
        "items": [{"sku": "a"}, {"$secret": "env:ITEM_SECRET"}],
        "amount": 100,
    }
    assert find_refs(arguments) == [
        ("arguments.api_key", SecretRef("env", "STRIPE_KEY")),
        ("arguments.card.token", SecretRef("file", "card-token.txt")),
        ("arguments.items[1]", SecretRef("env", "ITEM_SECRET")),
    ]


@pytest.mark.parametrize(
    "ref",
    [
        {"$secret": "env:STRIPE_KEY", "fallback": "sk_live_x"},  # a value beside it
        {"$secret": "vault:stripe"},  # unknown scheme
        {"$secret": "env:"},
        {"$secret": "env:A-B"},
        {"$secret": "file:../etc/passwd"},  # never a path
        {"$secret": "file:/etc/passwd"},
        {"$secret": "file:.."},
        {"$secret": 42},
    ],
)
def test_a_malformed_reference_is_refused_with_its_field(ref: object) -> None:
    with pytest.raises(InvalidSecretRefError) as caught:
        find_refs({"outer": {"key": ref}})
    assert caught.value.details["field"] == "arguments.outer.key"


def test_resolving_replaces_references_and_copies_everything_else() -> None:
    arguments = {"key": {"$secret": "env:K"}, "nested": [{"$secret": "file:f"}], "n": 1}
    values = {"env:K": "sk_test_1", "file:f": "tok_2"}
    resolved = resolve_refs(arguments, lambda ref: values[ref.text])
    assert resolved == {"key": "sk_test_1", "nested": ["tok_2"], "n": 1}
    assert arguments["key"] == {"$secret": "env:K"}  # the stored form is untouched


def test_an_allowed_field_previews_as_its_reference_and_others_stay_hidden() -> None:
    arguments = {"api_key": {"$secret": "env:K"}, "token": {"$secret": "env:T"}}
    assert redacted_preview(arguments, ["api_key"]) == {
        "api_key": {"$secret": "env:K"},
        HIDDEN_FIELDS: 1,
    }


def test_a_malformed_reference_in_a_result_is_not_previewed() -> None:
    output = {"id": {"$secret": "env:K", "leak": "sk_live_9"}}
    assert redacted_preview(output, ["id"]) == {"id": "<redacted>"}


def test_an_undeclared_reference_is_refused_with_one_message_for_any_name() -> None:
    messages = []
    for name in ("HELD_BY_THE_WORKER", "NOT_HELD"):
        found = find_refs({"token": {"$secret": f"env:{name}"}})
        with pytest.raises(SecretRefNotDeclaredError) as refused:
            refuse_undeclared(found, frozenset({"env:OTHER"}), contract="p.x@1")
        messages.append(str(refused.value))
        assert refused.value.details["field"] == "arguments.token"
    assert messages[0] == messages[1]
    assert "HELD" not in messages[0]


def test_declared_references_pass() -> None:
    found = find_refs({"a": {"$secret": "env:K"}, "b": [{"$secret": "file:f"}]})
    refuse_undeclared(found, frozenset({"env:K", "file:f"}), contract="p.x@1")
