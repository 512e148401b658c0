"""The SDK's exceptions mirror the broker's error taxonomy one to one, so a code on
the wire always arrives as its own typed exception and the two cannot drift."""

from __future__ import annotations

import pytest

from effect_broker import client
from effect_broker.client import errors
from effect_broker.domain.errors import (
    ERROR_CODES,
    EffectBrokerError,
    PayloadConflictError,
)


def _mirroring() -> dict[type[EffectBrokerError], type[errors.BrokerError]]:
    found: dict[type[EffectBrokerError], type[errors.BrokerError]] = {}
    for cls in errors.taxonomy().values():
        # The root mirrors the taxonomy's root, which ERROR_CODES leaves out.
        if cls.mirrors is not None and cls is not errors.BrokerError:
            assert cls.mirrors not in found, cls
            found[cls.mirrors] = cls
    return found


def test_every_code_of_the_taxonomy_has_exactly_one_sdk_exception() -> None:
    mirrored = _mirroring()
    assert {domain.code for domain in mirrored} == set(ERROR_CODES)
    for code, domain in ERROR_CODES.items():
        assert mirrored[domain].code == code
        assert errors.error_for_code(code) is mirrored[domain]


def test_the_sdk_hierarchy_is_the_taxonomy_hierarchy() -> None:
    # NumberOutOfRange is an InvalidJson, OutcomeUnknown an AdapterFailed, ...
    mirrored = _mirroring()
    for domain, sdk in mirrored.items():
        parent = domain.__mro__[1]
        if parent is EffectBrokerError:
            assert sdk.__mro__[1] is errors.BrokerError, sdk
        else:
            assert sdk.__mro__[1] is mirrored[parent], sdk


def test_every_sdk_exception_is_exported_and_documented() -> None:
    for cls in errors.taxonomy().values():
        assert getattr(client, cls.__name__) is cls
        assert (cls.__doc__ or "").strip()


def test_caller_side_outcomes_use_codes_outside_the_taxonomy() -> None:
    for cls in (
        errors.WaitTimeout,
        errors.EffectFailed,
        errors.EffectCompensated,
        errors.BrokerUnavailable,
    ):
        assert cls.mirrors is None
        assert cls.code not in ERROR_CODES
        # They never come off the wire: an unknown code stays a BrokerError.
        assert errors.error_for_code(cls.code) is errors.BrokerError


def test_a_payload_conflict_problem_becomes_payload_conflict_with_its_members() -> None:
    problem = {
        "type": "https://effect-broker.invalid/problems/payload_conflict",
        "title": "payload conflict",
        "status": 409,
        "code": "payload_conflict",
        "detail": "operation key 'k' is effect e1 ... Inspect the existing effect e1",
        "effect_id": "e1",
        "pinned_contract": "payments.charge@1",
    }
    error = errors.from_problem(409, problem)
    assert type(error) is errors.PayloadConflict
    assert (error.code, error.status, error.effect_id) == ("payload_conflict", 409, "e1")
    assert error.extras == {"effect_id": "e1", "pinned_contract": "payments.charge@1"}
    assert str(error) == problem["detail"]


def test_an_unknown_code_from_a_newer_broker_is_a_broker_error_with_that_code() -> None:
    error = errors.from_problem(418, {"code": "teapot_refused", "detail": "no"})
    assert type(error) is errors.BrokerError
    assert (error.code, error.status, str(error)) == ("teapot_refused", 418, "no")


def test_a_domain_error_maps_to_the_same_exception_and_fields_as_over_http() -> None:
    domain = PayloadConflictError("drift", effect_id="e9", pinned_contract="c@1")
    error = errors.from_domain(domain)
    assert type(error) is errors.PayloadConflict
    assert (error.status, error.effect_id, str(error)) == (409, "e9", "drift")


def test_two_classes_cannot_share_a_code() -> None:
    with pytest.raises(TypeError, match="reuses the code payload_conflict"):

        class Twin(errors.BrokerError):
            mirrors = PayloadConflictError
