"""The operator console's forms: a reason and evidence for every settlement, and a
new tenant's name.

The forms parse and bound input only; the rules (which resolution is open for which
safety class, what evidence must name) live in the services, which re-check them on
every submit (``services.resolution``, ``services.forking``, ``domain.evidence``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django import forms

from effect_broker.admin_console import RESOLUTION_LABELS
from effect_broker.domain.canonical import parse_json_strict
from effect_broker.domain.errors import InvalidJsonError, UnstorableTextError
from effect_broker.domain.evidence import EVIDENCE_SHAPES
from effect_broker.domain.storable_text import require_storable
from effect_broker.models import Tenant

MAX_TENANT_NAME = 200


def _shapes_help(*kinds: str) -> str:
    return "; ".join(f"{kind}: {', '.join(EVIDENCE_SHAPES[kind])}" for kind in kinds)


class ChoiceRadios(forms.RadioSelect):
    """Radio buttons with some options greyed out: the ones the services would refuse
    for this effect now (shown, so the operator sees that they exist and why not)."""

    def __init__(self, *args: Any, closed: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closed = frozenset(closed)

    def create_option(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        option = super().create_option(*args, **kwargs)
        if option["value"] in self.closed:
            option["attrs"]["disabled"] = True
        return option


class ReasonForm(forms.Form):
    """The reason every resolution records in its event."""

    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000)


class ResolveForm(ReasonForm):
    """One effect, one of the operator's three choices, with its evidence."""

    resolution = forms.ChoiceField(choices=list(RESOLUTION_LABELS))
    evidence = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6}),
        required=False,
        help_text="A JSON object with at least these members - "
        + _shapes_help("succeeded", "not_committed", "failed")
        + " (failed: optional). Stored encrypted in the receipt (success) and by "
        "digest in the event.",
    )
    external_id = forms.CharField(required=False, max_length=500)
    field_order = ["resolution", "reason", "evidence", "external_id"]

    def __init__(self, *args: Any, closed: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A closed choice is greyed out; a forged post of it still reaches the
        # service, which refuses it with its own message.
        self.fields["resolution"].widget = ChoiceRadios(
            choices=list(RESOLUTION_LABELS), closed=closed
        )

    def clean_evidence(self) -> dict[str, Any]:
        """Parse the evidence with the broker's strict JSON rules."""
        return json_object(self.cleaned_data.get("evidence", ""))


class ForkForm(ReasonForm):
    """Fork one effect: settle it, and continue its business as a new effect with
    its own operation key."""

    new_operation_key = forms.CharField(max_length=1024)
    evidence = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text="Your attestation that the old effect never committed, as a JSON "
        "object with at least: " + _shapes_help("fork"),
    )
    field_order = ["new_operation_key", "reason", "evidence"]

    def clean_evidence(self) -> dict[str, Any]:
        """Parse the evidence with the broker's strict JSON rules."""
        return json_object(self.cleaned_data.get("evidence", ""))


def json_object(raw: str) -> dict[str, Any]:
    """Parse an evidence text as one JSON object, or raise a form error."""
    raw = raw.strip()
    if not raw:
        return {}
    try:
        value = parse_json_strict(raw)
    except InvalidJsonError as exc:
        raise forms.ValidationError(str(exc)) from exc
    if not isinstance(value, dict):
        raise forms.ValidationError("evidence must be a JSON object")
    try:
        # A JSON escape (\u0000) gets past the form's NUL check on the raw text
        # (issue 12: a NUL in an evidence key was a 500).
        require_storable(value, "evidence")
    except UnstorableTextError as exc:
        raise forms.ValidationError(str(exc)) from exc
    return value


class TenantCreateForm(forms.Form):
    """A new tenant: only its name; the API key is made by ``services.tenants``."""

    name = forms.CharField(
        max_length=MAX_TENANT_NAME,
        help_text="Unique. The tenant's API key is shown once, on the next page.",
    )

    def clean_name(self) -> str:
        """A name no other tenant has (checked here so the error is a form error;
        the unique constraint still decides a race, see ``TenantAdmin``)."""
        name = str(self.cleaned_data["name"]).strip()
        if Tenant.objects.filter(name=name).exists():
            raise forms.ValidationError(
                f"A tenant named {name!r} already exists. Tenant names are unique.",
                code="unique",
            )
        return name
