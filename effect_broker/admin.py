"""Django admin: the operator console. Tenants are editable; ledger rows are evidence.

Issue 11: an operator finds the effects waiting for a person ("Needs an operator",
oldest first, counted on the index), reads one effect's timeline, attempts, receipt,
chain check and linked jobs on its page, and settles it there. Reading is
``effect_broker.admin_console``; settling goes through ``services.resolution`` and
``services.forking`` from the two small form views here; nothing writes a ledger row
directly. Who may resolve or fork: an active staff user holding
``effect_broker.resolve_effect`` (``services.operators``), and the operator recorded in
the events is the logged-in user - the service re-checks it, so a forged post changes
nothing either. The read-only ledger admins are ``effect_broker.admin_ledger``, the
tenants' ``effect_broker.admin_tenants``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from effect_broker import admin_console as console
from effect_broker.admin_approvals import ApprovalViews, amount_of
from effect_broker.admin_forms import ForkForm, ReasonForm, ResolveForm
from effect_broker.admin_ledger import ReadOnlyAdmin
from effect_broker.admin_login import ThrottledAdminLoginForm
from effect_broker.admin_pauses import DispatchPauseAdmin
from effect_broker.admin_tenants import TenantAdmin
from effect_broker.domain.errors import EffectBrokerError, OperatorForbiddenError
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectFork, EffectIntent, EffectReceipt
from effect_broker.services import (
    argument_reads,
    forking,
    operators,
    pauses,
    resolution,
)
from effect_broker.services.resolution import RESOLVABLE

_PAGE = "admin/effect_broker/operator_page.html"
_CSS = ("effect_broker/admin/console.css",)
__all__ = ["DispatchPauseAdmin", "EffectIntentAdmin", "TenantAdmin"]

# The index shows how many effects wait for an operator (a block above the app list).
admin.site.index_template = "admin/effect_broker/index.html"
# Failed logins are throttled per username and address (effect_broker.admin_login).
admin.site.login_form = ThrottledAdminLoginForm


@admin.register(EffectIntent)
class EffectIntentAdmin(ApprovalViews, ReadOnlyAdmin):
    """Effects: a coloured changelist, the operator queue, and the effect page."""

    # Status and age first: they are what an operator scans for (issue 11).
    list_display = (
        "status_badge",
        "age",
        "operation_key",
        "tenant",
        "tool",
        "contract",
        "safety_class",
        "resolve_link",
    )
    list_display_links = ("operation_key",)
    readonly_fields = ("fork_links",)
    # What an operator reads first stays open; the rest of the row is one click away,
    # so the timeline and the choices below are not pushed off the first screen.
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("operation_key", "tenant"),
                    ("tool", "contract_name", "contract_version", "safety_class"),
                    ("status", "version", "attempt_count", "outcome_in_doubt"),
                    ("created_at", "updated_at"),
                    # The contract's preview fields (the amount, the order): what an
                    # operator decides on, never hidden (issue 20). The full arguments
                    # are an audited read: the "arguments" page.
                    "arguments_preview",
                    "fork_links",
                )
            },
        ),
        (
            "Stored row",
            {
                "classes": ("collapse",),
                "fields": (
                    "id",
                    "arguments_key_id",
                    "next_action_at",
                    ("lease_owner", "lease_expires_at"),
                    "first_dispatch_at",
                    ("retention_deadline", "settlement_deadline"),
                    "receipt_id",
                    "trace_id",
                    "requested_by",
                ),
            },
        ),
    )
    list_filter = ("status", "safety_class", "tool")
    list_select_related = ("tenant",)
    search_fields = ("operation_key",)
    # request_hash: not for display, even keyed (issue 9, defect 10).
    exclude = ("arguments_ciphertext", "downstream_key", "request_hash")
    actions = ("request_reconciliation", "resolve_mark_failed")
    change_form_template = "admin/effect_broker/effectintent/change_form.html"
    change_list_template = "admin/effect_broker/effectintent/change_list.html"

    class Media:
        css = {"all": _CSS}

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: EffectIntent) -> str:
        """The status in its colour: red needs an operator, amber unknown, grey
        settled (issue 11: a green tick meant "needs operator")."""
        tone = console.status_tone(obj.status, obj.safety_class)
        return format_html(
            '<span class="eb-status {}" title="{}">{}</span> <code>{}</code>',
            tone.css,
            tone.label,
            tone.label,
            obj.status,
        )

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: EffectIntent) -> str:
        """Time since the effect was submitted."""
        return console.age_of(obj.created_at)

    @admin.display(description="contract")
    def contract(self, obj: EffectIntent) -> str:
        """The contract the effect is pinned to, with its version."""
        return f"{obj.contract_name}@{obj.contract_version}"

    @admin.display(description="resolve")
    def resolve_link(self, obj: EffectIntent) -> str:
        """Links to the resolution and fork forms for effects an operator may settle,
        and to the approval block of an effect awaiting approval."""
        if obj.status == EffectStatus.AWAITING_APPROVAL:
            page = reverse("admin:effect_broker_effectintent_change", args=[obj.pk])
            return format_html('<a href="{}#approval">approve or deny…</a>', page)
        if obj.status not in RESOLVABLE:
            return ""
        resolve = reverse("admin:effect_broker_effectintent_resolve", args=[obj.pk])
        fork = reverse("admin:effect_broker_effectintent_fork", args=[obj.pk])
        return format_html(
            '<a href="{}">resolve…</a> <a href="{}">fork…</a>', resolve, fork
        )

    @admin.display(description="fork links")
    def fork_links(self, obj: EffectIntent) -> str:
        """The effect this one was forked from, and its fork (spec: time travel)."""
        link = EffectFork.objects.filter(new_effect_id=obj.pk).first()
        fork = EffectFork.objects.filter(old_effect_id=obj.pk).first()
        parts = []
        if link is not None:
            parts.append(f"forked from {link.old_effect_id} by {link.operator}")
        if fork is not None:
            parts.append(f"forked to {fork.new_effect_id} by {fork.operator}")
        return "; ".join(parts) or "-"

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        """Resolution is an operator's act: active staff with ``resolve_effect``."""
        try:
            operators.operator_name(request.user)
        except OperatorForbiddenError:
            return False
        return True

    def get_urls(self) -> list[URLPattern]:
        """Add the queue, ``<id>/resolve/`` and ``<id>/fork/`` before the stock
        ``<id>/`` routes."""
        extra = [
            path(
                "needs-operator/",
                self.admin_site.admin_view(self.queue_view),
                name="effect_broker_effectintent_queue",
            ),
            path(
                "<uuid:effect_id>/resolve/",
                self.admin_site.admin_view(self.resolve_view),
                name="effect_broker_effectintent_resolve",
            ),
            path(
                "<uuid:effect_id>/arguments/",
                self.admin_site.admin_view(self.arguments_view),
                name="effect_broker_effectintent_arguments",
            ),
            path(
                "<uuid:effect_id>/fork/",
                self.admin_site.admin_view(self.fork_view),
                name="effect_broker_effectintent_fork",
            ),
        ]
        return [*extra, *self.approval_urls(), *super().get_urls()]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The stock changelist, with the queue's count on its object tools."""
        context = {**(extra_context or {}), "queue_count": console.queue_count()}
        return super().changelist_view(request, extra_context=context)

    def queue_view(self, request: HttpRequest) -> HttpResponse:
        """Needs an operator: outcome_unknown and manual_review effects, oldest first."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Needs an operator",
            "rows": console.queue_rows(),
            "total": console.queue_count(),
            "page_size": console.QUEUE_PAGE,
            "may_resolve": self.has_resolve_permission(request),
            "media": self.media,
        }
        return TemplateResponse(
            request, "admin/effect_broker/effectintent/queue.html", context
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The effect page: the stock read-only fields, then the operator's view."""
        intent = (
            EffectIntent.objects.select_related("tenant").filter(pk=object_id).first()
            if _is_uuid(object_id)
            else None
        )
        if intent is not None and self.has_view_permission(request, intent):
            extra_context = {**(extra_context or {}), **self._console(request, intent)}
        return super().change_view(request, object_id, form_url, extra_context)

    def _console(self, request: HttpRequest, intent: EffectIntent) -> dict[str, Any]:
        chain, events = console.timeline(intent)
        may_resolve = self.has_resolve_permission(request)
        choices = console.choices(intent) if intent.status in RESOLVABLE else []
        closed = [c.value for c in choices if not c.available]
        return {
            "tone": console.status_tone(intent.status, intent.safety_class),
            "age": console.age_of(intent.created_at),
            "waiting": console.age_of(intent.updated_at),
            "chain": chain,
            "events": events,
            "attempts": console.attempts(intent),
            "receipt": EffectReceipt.objects.filter(effect_id=intent.pk).first(),
            # An operator's pause holding it (issue 24): why it is not being sent.
            "pause": pauses.holding(
                status=EffectStatus(intent.status),
                safety=SafetyClass(intent.safety_class),
                tool=intent.tool,
                contract_name=intent.contract_name,
                contract_version=intent.contract_version,
                tenant_id=str(intent.tenant_id),
            ),
            "jobs": console.linked_jobs(intent),
            "choices": choices,
            "may_resolve": may_resolve,
            # The full arguments, an audited read: while an operator must decide.
            "awaiting_operator": may_resolve
            and (
                intent.status in RESOLVABLE
                or intent.status == EffectStatus.AWAITING_APPROVAL
            ),
            **self.approval_context(request, intent),
            "fork_open": "fork" not in closed,
            "resolve_form": ResolveForm(closed=closed) if may_resolve else None,
            # Its own ids: both forms have a reason and an evidence field.
            "fork_form": (
                ForkForm(auto_id="fork_%s")
                if may_resolve and "fork" not in closed
                else None
            ),
            "resolve_url": reverse(
                "admin:effect_broker_effectintent_resolve", args=[intent.pk]
            ),
            "fork_url": reverse(
                "admin:effect_broker_effectintent_fork", args=[intent.pk]
            ),
        }

    @admin.action(description="Request reconciliation", permissions=["resolve"])
    def request_reconciliation(
        self, request: HttpRequest, queryset: QuerySet[EffectIntent]
    ) -> None:
        """Defer reconcile jobs; unsafe unknown effects are refused with advice."""
        deferred, idle, refused = 0, 0, []
        for intent in queryset.select_related("tenant"):
            try:
                asked = resolution.request_reconciliation(
                    intent.tenant,
                    str(intent.pk),
                    requested_by=f"admin:{request.user.get_username()}",
                )
            except EffectBrokerError as exc:
                refused.append(f"{intent.operation_key}: {exc}")
                continue
            deferred, idle = deferred + asked.deferred, idle + (not asked.deferred)
        if deferred:
            self.message_user(request, f"Reconciliation requested for {deferred}.")
        if idle:
            self.message_user(
                request,
                f"{idle} not reconciled: only outcome_unknown effects are.",
                messages.WARNING,
            )
        _report_refusals(self, request, refused)

    @admin.action(description="Resolve: mark failed", permissions=["resolve"])
    def resolve_mark_failed(
        self, request: HttpRequest, queryset: QuerySet[EffectIntent]
    ) -> HttpResponse | None:
        """Ask for a reason, then mark each selected effect FAILED_FINAL."""
        effects = list(queryset.select_related("tenant"))
        form = ReasonForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self._page(
                request,
                form,
                title="Resolve: mark failed",
                intro="Mark these effects as finally failed. They will never be "
                "dispatched again and get no receipt.",
                effects=effects,
                action="resolve_mark_failed",
                submit="Mark failed",
            )
        done, refused = 0, []
        for intent in effects:
            try:
                resolution.resolve_failed(
                    intent.tenant,
                    str(intent.pk),
                    operator=request.user,
                    reason=form.cleaned_data["reason"],
                )
            except EffectBrokerError as exc:
                refused.append(f"{intent.operation_key}: {exc}")
                continue
            done += 1
        if done:
            self.message_user(request, f"Marked {done} effect(s) failed.")
        _report_refusals(self, request, refused)
        return None

    def _operator_target(self, request: HttpRequest, effect_id: Any) -> EffectIntent:
        """The effect an operator page acts on, once the user may resolve effects."""
        if not self.has_resolve_permission(request):
            raise PermissionDenied
        intent = (
            EffectIntent.objects.select_related("tenant").filter(pk=effect_id).first()
        )
        if intent is None:
            raise Http404("no such effect")
        return intent

    def resolve_view(self, request: HttpRequest, effect_id: Any) -> HttpResponse:
        """Resolve one effect: success or non-commit with evidence, or failure."""
        intent = self._operator_target(request, effect_id)
        closed = [c.value for c in console.choices(intent) if not c.available]
        form = ResolveForm(
            request.POST if request.method == "POST" else None, closed=closed
        )
        if form.is_valid():
            data = form.cleaned_data
            try:
                after = resolution.resolve(
                    intent.tenant,
                    str(intent.pk),
                    data["resolution"],
                    operator=request.user,
                    reason=data["reason"],
                    evidence=data["evidence"],
                    external_id=data["external_id"] or None,
                )
            except EffectBrokerError as exc:
                form.add_error(None, f"[{exc.code}] {exc}")
            else:
                self.message_user(
                    request,
                    f"{intent.operation_key}: {intent.status} -> {after.status.value}",
                )
                return HttpResponseRedirect(
                    reverse("admin:effect_broker_effectintent_change", args=[intent.pk])
                )
        return self._page(
            request,
            form,
            title=f"Resolve {intent.operation_key}",
            intro="There is no 'retry anyway': requeue only with evidence that the "
            "target never applied the request.",
            effects=[intent],
            action="",
            submit="Resolve",
        )

    def arguments_view(self, request: HttpRequest, effect_id: Any) -> HttpResponse:
        """Show one effect's full arguments, after recording the read as an event."""
        intent = self._operator_target(request, effect_id)
        form = ReasonForm(request.POST if request.method == "POST" else None)
        arguments = None
        if form.is_valid():
            try:
                arguments = argument_reads.read_arguments(
                    intent.tenant,
                    str(intent.pk),
                    operator=request.user,
                    reason=form.cleaned_data["reason"],
                )
            except EffectBrokerError as exc:
                form.add_error(None, f"[{exc.code}] {exc}")
        response = self._page(
            request,
            form,
            title=f"Arguments of {intent.operation_key}",
            intro="The full arguments are encrypted at rest. Reading them is recorded "
            "on the effect's event chain (arguments_read: you, and your reason).",
            effects=[intent],
            action="",
            submit="Show the arguments",
        )
        if arguments is not None:
            assert isinstance(response, TemplateResponse)
            response.context_data = {
                **(response.context_data or {}),
                "arguments": json.dumps(arguments, indent=2, ensure_ascii=False),
                # What an approval decides on (issue 24): the value its rule tests.
                "amount": amount_of(intent, arguments),
            }
        return response

    def fork_view(self, request: HttpRequest, effect_id: Any) -> HttpResponse:
        """Fork one effect: settle it and reserve a new effect under a new key."""
        intent = self._operator_target(request, effect_id)
        form = ForkForm(request.POST if request.method == "POST" else None)
        if form.is_valid():
            data = form.cleaned_data
            try:
                forked = forking.fork(
                    intent.tenant,
                    str(intent.pk),
                    operator=request.user,
                    new_operation_key=data["new_operation_key"],
                    reason=data["reason"],
                    evidence=data["evidence"],
                )
            except EffectBrokerError as exc:
                form.add_error(None, f"[{exc.code}] {exc}")
            else:
                self.message_user(
                    request,
                    f"{intent.operation_key}: forked to {forked.new.operation_key} "
                    f"(effect {forked.new.effect_id}); the old effect is "
                    f"{forked.old.status.value}",
                )
                return HttpResponseRedirect(
                    reverse(
                        "admin:effect_broker_effectintent_change",
                        args=[forked.new.effect_id],
                    )
                )
        return self._page(
            request,
            form,
            title=f"Fork {intent.operation_key}",
            intro="A fork is a NEW business operation under a new operation key: the "
            "old effect is settled failed_final on your attestation that it never "
            "committed, and the new one is dispatched. Only fork with evidence.",
            effects=[intent],
            action="",
            submit="Fork",
        )

    def _page(
        self,
        request: HttpRequest,
        form: forms.Form,
        *,
        title: str,
        intro: str,
        effects: list[EffectIntent],
        action: str,
        submit: str,
    ) -> HttpResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": title,
            "intro": intro,
            "form": form,
            "effects": effects,
            "choices": console.choices(effects[0]) if len(effects) == 1 else [],
            "selected": effects if action else [],
            "checkbox_name": ACTION_CHECKBOX_NAME,
            "action": action,
            "submit": submit,
            "media": self.media,
        }
        return TemplateResponse(request, _PAGE, context)


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def _report_refusals(
    model_admin: admin.ModelAdmin, request: HttpRequest, refused: Iterable[str]
) -> None:
    for line in refused:
        model_admin.message_user(request, f"Refused: {line}", messages.ERROR)
