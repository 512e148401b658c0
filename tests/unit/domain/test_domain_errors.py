"""The error taxonomy (STYLE rule 3): stable codes, HTTP statuses, default messages."""

from __future__ import annotations

import pickle
import re

import pytest

from effect_broker.domain import errors
from effect_broker.domain.errors import (
    ERROR_CODES,
    AdapterError,
    ContractError,
    EffectBrokerError,
    IllegalTransitionError,
    InvalidJsonError,
    NumberOutOfRangeError,
    OutcomeUnknownError,
    RetryableAdapterError,
    StaleWriteError,
    TerminalAdapterError,
)


def _all_error_classes() -> list[type[EffectBrokerError]]:
    pending = list(EffectBrokerError.__subclasses__())
    found: list[type[EffectBrokerError]] = []
    while pending:
        cls = pending.pop()
        if cls.__module__ == errors.__name__:
            found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


EXPECTED = {
    "InvalidJsonError": ("invalid_json", 400),
    "NumberOutOfRangeError": ("number_out_of_range", 400),
    "ContractError": ("invalid_contract", 500),
    "UnknownContractError": ("unknown_contract", 422),
    "ContractsUnavailableError": ("contracts_unavailable", 503),
    "PayloadConflictError": ("payload_conflict", 409),
    "UnstorableTextError": ("unstorable_text", 422),
    "UnknownFieldError": ("unknown_field", 422),
    "ArgumentsTooLargeError": ("arguments_too_large", 422),
    "PayloadTooLargeError": ("payload_too_large", 413),
    "RequestTimeoutError": ("request_timeout", 408),
    "UnsupportedMediaTypeError": ("unsupported_media_type", 415),
    "RouteNotFoundError": ("route_not_found", 404),
    "MethodNotAllowedError": ("method_not_allowed", 405),
    "DisallowedHostError": ("disallowed_host", 400),
    "OriginNotAllowedError": ("origin_not_allowed", 403),
    "StaleWriteError": ("stale_write", 409),
    "UnfencedWriteError": ("unfenced_write", 500),
    "IllegalTransitionError": ("illegal_transition", 409),
    "AlreadyApprovedError": ("already_approved", 409),
    "ApprovalNotPendingError": ("approval_not_pending", 409),
    "ApprovalExpiredError": ("approval_expired", 409),
    "AppendOnlyError": ("append_only", 500),
    "EffectNotFoundError": ("effect_not_found", 404),
    "TenantNotFoundError": ("tenant_not_found", 404),
    "TenantDisabledError": ("tenant_disabled", 403),
    "AuthenticationError": ("unauthenticated", 401),
    "CredentialInQueryError": ("credential_in_query", 400),
    "RateLimitedError": ("rate_limited", 429),
    "InvalidSecretRefError": ("invalid_secret_ref", 422),
    "SecretRefNotDeclaredError": ("secret_ref_not_declared", 422),
    "SecretUnavailableError": ("secret_unavailable", 500),
    "OperatorForbiddenError": ("operator_forbidden", 403),
    "AlreadyPausedError": ("already_paused", 409),
    "PauseNotFoundError": ("pause_not_found", 404),
    "InvalidRequestError": ("invalid_request", 400),
    "ConfigurationError": ("configuration", 500),
    "EventChainBrokenError": ("event_chain_broken", 500),
    "DecryptionError": ("decryption_failed", 500),
    "EmbeddedPostgresError": ("embedded_postgres", 500),
    "OverloadedError": ("overloaded", 503),
    "DatabaseUnavailableError": ("database_unavailable", 503),
    "DatabaseConflictError": ("database_conflict", 503),
    "AdapterError": ("adapter_error", 502),
    "RetryableAdapterError": ("adapter_retryable", 502),
    "SendRefusedError": ("send_refused", 502),
    "TerminalAdapterError": ("adapter_terminal", 502),
    "KeyReusedError": ("key_reused", 502),
    "OutcomeUnknownError": ("outcome_unknown", 502),
}


@pytest.mark.parametrize(("name", "code_and_status"), sorted(EXPECTED.items()))
def test_given_error_class_then_code_and_http_status_are_the_published_ones(
    name: str, code_and_status: tuple[str, int]
) -> None:
    cls = getattr(errors, name)
    assert issubclass(cls, EffectBrokerError)
    assert (cls.code, cls.http_status) == code_and_status


def test_given_all_subclasses_then_codes_are_unique_and_each_class_declares_its_own() -> (
    None
):
    classes = _all_error_classes()
    codes = [cls.code for cls in classes]
    assert len(codes) == len(set(codes))
    assert all("code" in vars(cls) for cls in classes)
    assert {cls.__name__ for cls in classes} == set(EXPECTED)


def test_given_error_codes_registry_then_it_maps_every_code_to_its_class() -> None:
    assert {cls.code: cls for cls in _all_error_classes()} == ERROR_CODES
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", code) for code in ERROR_CODES)


def test_given_no_message_then_the_docstring_first_paragraph_is_the_message() -> None:
    error = StaleWriteError()
    assert (
        error.message
        == "The effect changed since it was read; the fenced write was refused."
    )
    assert str(error) == error.message
    assert error.details == {}


def test_given_message_and_details_then_both_are_kept() -> None:
    error = IllegalTransitionError("illegal transition a -> b", old="a", new="b")
    assert str(error) == "illegal transition a -> b"
    assert error.details == {"old": "a", "new": "b"}
    assert error.to_dict() == {
        "code": "illegal_transition",
        "message": "illegal transition a -> b",
        "details": {"old": "a", "new": "b"},
    }


def test_given_number_out_of_range_then_default_message_says_how_money_travels() -> None:
    error = NumberOutOfRangeError()
    assert isinstance(error, InvalidJsonError)
    assert error.message == (
        "Number outside the exact JSON range ±(2**53-1); money and big numbers travel "
        "as strings or minor-unit integers."
    )


def test_given_contract_error_then_message_names_file_contract_and_field() -> None:
    error = ContractError(
        "required for safety class idempotent",
        file="contracts.toml",
        contract="payments.charge",
        version="1",
        field="key_retention",
    )
    assert str(error) == (
        "contracts.toml: contract 'payments.charge' v1: field 'key_retention': "
        "required for safety class idempotent"
    )
    assert error.details["file"] == "contracts.toml"
    assert error.details["contract"] == "payments.charge"
    assert error.details["field"] == "key_retention"
    assert error.details["reason"] == "required for safety class idempotent"


def test_given_adapter_errors_then_the_three_kinds_are_adapter_errors() -> None:
    for cls in (RetryableAdapterError, TerminalAdapterError, OutcomeUnknownError):
        assert issubclass(cls, AdapterError)
        assert cls.http_status == 502
    assert len({RetryableAdapterError, TerminalAdapterError, OutcomeUnknownError}) == 3


def test_given_pickled_error_then_class_message_and_details_survive() -> None:
    original = ContractError("bad", file="f.toml", contract="c", version="2", field="x")
    restored = pickle.loads(pickle.dumps(original))  # noqa: S301 - our own bytes
    assert type(restored) is ContractError
    assert str(restored) == "f.toml: contract 'c' v2: field 'x': bad"
    assert restored.details == original.details


def _adapter_boundary(cause: Exception) -> None:
    try:
        raise cause
    except ValueError as exc:
        raise TerminalAdapterError("target said no", status=422) from exc


def test_given_foreign_exception_wrapped_then_cause_is_kept() -> None:
    cause = ValueError("boom")
    with pytest.raises(TerminalAdapterError) as caught:
        _adapter_boundary(cause)
    assert caught.value.__cause__ is cause
    assert caught.value.details == {"status": 422}
