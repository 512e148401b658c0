"""The operator console's approval views (issue 24): approve or deny an effect that
waits for a person, from its page.

The effect page shows what an operator decides on - the contract's preview fields (the
amount, the currency), the rule that made it wait, the deadline and the time left -
and links to the full arguments, an audited read (``services.argument_reads``: an
``arguments_read`` event with the operator and the reason, in the same transaction as
the decryption). The two forms post here; the decision is ``services.approvals``'s,
which re-checks the operator (active staff holding ``effect_broker.resolve_effect``),
the state and the deadline on every submit, so a forged post changes nothing either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from effect_broker import admin_console as console
from effect_broker.admin_forms import ReasonForm
from effect_broker.domain.approval import MISSING, resolve_pointer
from effect_broker.domain.errors import EffectBrokerError, UnknownContractError
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectIntent
from effect_broker.services import approvals
from effect_broker.services.runtime import get_runtime


def approval_rule(intent: EffectIntent) -> Any:
    """The approval rule of the contract ``intent`` is pinned to (None if it has
    none, or the version is no longer deployed)."""
    try:
        contract = get_runtime().registry.get(
            intent.contract_name, intent.contract_version
        )
    except UnknownContractError:
        return None
    return contract.approval


def amount_of(intent: EffectIntent, arguments: Any) -> tuple[str, Any] | None:
    """The value the approval rule tests (``/amount_minor``) in the decrypted
    ``arguments``, with its pointer; None when the rule tests none."""
    rule = approval_rule(intent)
    if rule is None or not rule.amount_pointer:
        return None
    value = resolve_pointer(arguments, rule.amount_pointer)
    return rule.amount_pointer, "(missing)" if value is MISSING else value


class ApprovalViews:
    """Mixed into ``EffectIntentAdmin``: the approve and deny routes and the page's
    approval block."""

    # Provided by EffectIntentAdmin (declared for the type checker only: a stub
    # here would come first in the MRO and shadow the admin's own).
    if TYPE_CHECKING:
        admin_site: Any

        def has_resolve_permission(self, request: HttpRequest) -> bool: ...

        def message_user(self, *args: Any, **kwargs: Any) -> None: ...

        def _operator_target(
            self, request: HttpRequest, effect_id: Any
        ) -> EffectIntent: ...

    def approval_urls(self) -> list[URLPattern]:
        """``<id>/approve/`` and ``<id>/deny/`` (before the stock ``<id>/`` routes)."""
        return [
            path(
                f"<uuid:effect_id>/{verb}/",
                self.admin_site.admin_view(getattr(self, f"{verb}_view")),
                name=f"effect_broker_effectintent_{verb}",
            )
            for verb in ("approve", "deny")
        ]

    def approval_context(
        self, request: HttpRequest, intent: EffectIntent
    ) -> dict[str, Any]:
        """The page's approval block: only while the effect awaits approval."""
        if intent.status != EffectStatus.AWAITING_APPROVAL:
            return {}
        rule = approval_rule(intent)
        may_decide = self.has_resolve_permission(request)
        return {
            "approval": {
                "deadline": intent.next_action_at,
                "left": console.time_left(intent.next_action_at),
                "rule": rule.describe() if rule is not None else "-",
                "form": ReasonForm(auto_id="approval_%s") if may_decide else None,
                "approve_url": reverse(
                    "admin:effect_broker_effectintent_approve", args=[intent.pk]
                ),
                "deny_url": reverse(
                    "admin:effect_broker_effectintent_deny", args=[intent.pk]
                ),
            }
        }

    def approve_view(self, request: HttpRequest, effect_id: Any) -> HttpResponse:
        """POST: approve the effect (it is then dispatched, once)."""
        return self._decide(request, effect_id, "approve")

    def deny_view(self, request: HttpRequest, effect_id: Any) -> HttpResponse:
        """POST: deny the effect (failed_final, never sent)."""
        return self._decide(request, effect_id, "deny")

    def _decide(self, request: HttpRequest, effect_id: Any, verb: str) -> HttpResponse:
        intent = self._operator_target(request, effect_id)
        page = reverse("admin:effect_broker_effectintent_change", args=[intent.pk])
        form = ReasonForm(request.POST if request.method == "POST" else None)
        if not form.is_valid():
            self.message_user(
                request, f"To {verb} an effect, give a reason.", messages.ERROR
            )
            return HttpResponseRedirect(page + "#approval")
        decide = approvals.approve if verb == "approve" else approvals.deny
        try:
            after = decide(
                intent.tenant,
                str(intent.pk),
                operator=request.user,
                reason=form.cleaned_data["reason"],
            )
        except EffectBrokerError as exc:
            self.message_user(request, f"Refused: [{exc.code}] {exc}", messages.ERROR)
        else:
            self.message_user(
                request,
                f"{intent.operation_key}: {intent.status} -> {after.status.value}"
                + (" (dispatched once)" if verb == "approve" else " (never sent)"),
            )
        return HttpResponseRedirect(page)
