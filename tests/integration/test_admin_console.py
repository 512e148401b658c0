"""The operator console in Django's admin (issue 11, item 4), through the test client.

The queue lists outcome_unknown and manual_review effects oldest first, with the last
attempt's facts; the index counts them; the changelist paints "needs a person" red or
amber and settled effects neutral; the effect page shows the timeline, the chain check,
attempts, receipt, linked jobs and the resolution choices as the services restrict
them; tenants made here get their API key once, and a duplicate name is a form error.
The browser's view of the same pages: tests/integration/browser/.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse

from effect_broker.adapters.simulated_adapter import Fault
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus, SafetyClass
from effect_broker.models import EffectAttempt, EffectEvent, EffectReceipt, Tenant
from effect_broker.scheduling import ProcrastinateScheduler
from effect_broker.services import resolution, tenants
from effect_broker.services.dispatch import dispatch
from effect_broker.store import load_effect_for_worker, verify_event_chain
from tests.integration.conftest import make_operator
from tests.integration.engine.harness import Bench

S = EffectStatus
QUEUE = "admin:effect_broker_effectintent_queue"
CHANGELIST = "admin:effect_broker_effectintent_changelist"
PROOF = {"source": "dashboard", "reference": "ch_9"}


def change_url(record: EffectRecord) -> str:
    return reverse("admin:effect_broker_effectintent_change", args=[record.effect_id])


def status_of(record: EffectRecord) -> tuple[S, int]:
    now = load_effect_for_worker(record.effect_id)
    return now.status, now.version


def queue_ids(html: str) -> list[str]:
    return re.findall(r'data-effect-id="([0-9a-f-]{36})"', html)


def succeeded(bench: Bench) -> EffectRecord:
    record = bench.submit(SafetyClass.IDEMPOTENT)
    return dispatch(record.effect_id, worker="w1")


@pytest.fixture
def world(bench: Bench) -> dict[str, EffectRecord]:
    """Effects submitted a minute apart: two that need an operator (unsafe unknown,
    then idempotent unknown), one settled, one not yet dispatched."""
    made: dict[str, EffectRecord] = {}
    made["unsafe"] = bench.unknown_outcome(SafetyClass.UNSAFE)
    bench.advance(60)
    made["settled"] = succeeded(bench)
    bench.advance(60)
    made["idempotent"] = bench.unknown_outcome(SafetyClass.IDEMPOTENT)
    bench.advance(60)
    made["prepared"] = bench.submit(SafetyClass.UNSAFE)
    return made


# --- the queue and the index ------------------------------------------------------


def test_queue_lists_only_effects_awaiting_an_operator_oldest_first(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    page = admin_client.get(reverse(QUEUE))
    assert page.status_code == 200
    html = page.content.decode()
    # Then exactly the unknown effects are listed, the oldest first
    assert queue_ids(html) == [world["unsafe"].effect_id, world["idempotent"].effect_id]
    assert "2 waiting." in html


def test_queue_order_follows_submission_time_not_insertion(
    admin_client: Client, bench: Bench
) -> None:
    # Given an effect submitted first but lost last, and one submitted later but lost
    # first (so the older one's last transition is the newer)
    target = bench.targets[SafetyClass.UNSAFE]
    earlier = bench.submit(SafetyClass.UNSAFE)
    bench.advance(60)
    later = bench.submit(SafetyClass.UNSAFE)
    target.inject(Fault.LOSE_RESPONSE)
    assert dispatch(later.effect_id, worker="w1").status is S.OUTCOME_UNKNOWN
    bench.advance(60)
    target.inject(Fault.LOSE_RESPONSE)
    assert dispatch(earlier.effect_id, worker="w1").status is S.OUTCOME_UNKNOWN
    html = admin_client.get(reverse(QUEUE)).content.decode()
    # Then the queue is in submission order: the oldest effect is owed first
    assert queue_ids(html) == [earlier.effect_id, later.effect_id]


def test_queue_row_shows_age_tool_contract_safety_and_last_attempt(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    html = admin_client.get(reverse(QUEUE)).content.decode()
    row = html[html.index(f'data-effect-id="{world["unsafe"].effect_id}"') :]
    row = row[: row.index("</tr>")]
    assert 'class="eb-age"' in row
    assert "unsafe_charge" in row
    assert f"{world['unsafe'].contract_name}@{world['unsafe'].contract_version}" in row
    assert '<span class="eb-safety">unsafe</span>' in row
    # The last attempt: its outcome, error category and transport facts
    assert "#1 unknown" in row
    attempt = EffectAttempt.objects.get(effect_id=world["unsafe"].effect_id)
    assert attempt.error_category
    assert f"<code>{attempt.error_category}</code>" in row
    assert "bytes may have left: <strong>yes</strong>" in row
    assert "answered: no" in row
    assert 'class="eb-status eb-tone-operator"' in row


def test_index_counts_the_queue_and_links_to_it(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert re.search(r'id="operator-queue-count">2<', html)
    assert reverse(QUEUE) in html
    # Settled, it leaves the count
    resolution.resolve_failed(
        Tenant.objects.get(id=world["unsafe"].tenant_id),
        world["unsafe"].effect_id,
        operator=make_operator("ann"),
        reason="refunded by hand",
    )
    html = admin_client.get(reverse("admin:index")).content.decode()
    assert re.search(r'id="operator-queue-count">1<', html)


def test_index_shows_no_count_to_staff_who_may_not_view_effects(
    client: Client, world: dict[str, EffectRecord]
) -> None:
    clerk = User.objects.create_user("clerk", password="pw", is_staff=True)
    clerk.user_permissions.add(Permission.objects.get(codename="view_tenant"))
    client.force_login(clerk)
    html = client.get(reverse("admin:index")).content.decode()
    assert "operator-queue-count" not in html
    assert client.get(reverse(QUEUE)).status_code == 403


# --- the changelist's colours -----------------------------------------------------


def test_changelist_paints_needs_operator_red_unknown_amber_settled_neutral(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    html = admin_client.get(reverse(CHANGELIST)).content.decode()

    def row(record: EffectRecord) -> str:
        start = html.index(f'value="{record.effect_id}"')
        return html[start : html.index("</tr>", start)]

    assert "eb-tone-operator" in row(world["unsafe"])
    assert "eb-tone-unknown" in row(world["idempotent"])
    assert "eb-tone-settled" in row(world["settled"])
    assert "eb-tone-active" in row(world["prepared"])
    # No boolean tick or cross stands for a status any more
    assert "icon-yes" not in html
    assert "icon-no" not in html
    assert "effect_broker/admin/console.css" in html
    # Age is a column
    assert "column-age" in html
    # The queue is one click away, with its count
    assert "Needs an operator (2)" in html


# --- the effect page --------------------------------------------------------------


def test_effect_page_shows_timeline_chain_attempts_and_choices_for_unsafe(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    record = world["unsafe"]
    ProcrastinateScheduler().reconcile(record.effect_id)  # a real procrastinate row
    html = admin_client.get(change_url(record)).content.decode()
    # Timeline: every event, in order, with its actor and transition
    events = EffectEvent.objects.filter(effect_id=record.effect_id).order_by("sequence")
    timeline = html[html.index('id="effect-timeline"') :]
    positions = [timeline.index(f"<code>{e.event_type}</code>") for e in events]
    assert positions == sorted(positions)
    assert "outcome_unknown</strong>" in timeline
    # The chain verifier's verdict
    assert 'class="eb-chain-ok"' in html
    assert f"{events.count()} event(s), digest chain intact" in html
    # Attempts with their transport facts; no receipt yet
    assert 'id="effect-attempts"' in html
    assert "No receipt" in html
    # The linked job
    jobs = html[html.index('id="effect-jobs"') :]
    assert "effect_broker.reconcile_effect" in jobs
    # Choices: unsafe is never requeued under its key, so not_committed is closed,
    # with the service's own reason; the three others are open
    choices = html[html.index('id="resolution-choices"') :]
    assert re.search(r'eb-choice-closed" data-choice="not_committed"', choices)
    for open_choice in ("succeeded", "failed", "fork"):
        assert re.search(rf'eb-choice-open" data-choice="{open_choice}"', choices)
    assert "never resent under the same operation key" in choices
    assert re.search(r'value="not_committed"[^>]*disabled', html)
    assert 'id="resolve-form"' in html
    assert 'id="fork-form"' in html


def test_effect_page_shows_a_broken_chain_and_still_lists_the_rows(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    # Given an event rewritten behind the broker's back (as a privileged DBA could;
    # its triggers skipped for it, inside this test's transaction)
    record = world["unsafe"]
    with connection.cursor() as cur:
        cur.execute("SET LOCAL session_replication_role = replica")
        cur.execute(
            "UPDATE effect_events SET actor = 'mallory' "
            "WHERE effect_id = %s AND sequence = 2",
            [record.effect_id],
        )
        cur.execute("SET LOCAL session_replication_role = origin")
    html = admin_client.get(change_url(record)).content.decode()
    # Then the verifier's verdict is shown plainly, and the rows as they now are
    assert 'class="eb-chain-broken"' in html
    assert "BROKEN:" in html
    assert 'class="eb-chain-ok"' not in html
    assert "<td>mallory</td>" in html


@pytest.mark.parametrize(
    ("safety", "later", "closed"),
    [
        (SafetyClass.UNSAFE, 0, {"not_committed"}),
        # Before its settlement bound the target may still settle the request: neither
        # a requeue nor a fork (its duplicate) is open yet; after it, both are.
        (SafetyClass.RECONCILABLE, 0, {"not_committed", "fork"}),
        (SafetyClass.RECONCILABLE, 5, set()),
        # Within its key retention (1 h) a resend is deduplicated; past it, it is not.
        (SafetyClass.IDEMPOTENT, 0, set()),
        (SafetyClass.IDEMPOTENT, 3600, {"not_committed"}),
    ],
    ids=["unsafe", "reconcilable-early", "reconcilable-late", "idem-kept", "idem-lapsed"],
)
def test_effect_page_closes_exactly_the_choices_the_services_refuse(
    admin_client: Client, bench: Bench, safety: SafetyClass, later: int, closed: set[str]
) -> None:
    record = bench.unknown_outcome(safety)
    bench.advance(later)  # the database's clock, on which the deadlines are compared
    html = admin_client.get(change_url(record)).content.decode()
    by_choice = {
        choice: state
        for state, choice in re.findall(
            r'eb-choice-(open|closed)" data-choice="(\w+)"', html
        )
    }
    assert set(by_choice) == {"succeeded", "not_committed", "failed", "fork"}
    assert {c for c, state in by_choice.items() if state == "closed"} == closed
    assert ('id="fork-form"' in html) is ("fork" not in closed)
    # And the service agrees: a closed requeue is refused when posted anyway
    if "not_committed" in closed:
        before = status_of(record)
        admin_client.post(
            reverse("admin:effect_broker_effectintent_resolve", args=[record.effect_id]),
            {
                "resolution": "not_committed",
                "reason": "not there",
                "evidence": '{"source": "export", "checked_at": "2026-12-03T21:00:00Z"}',
            },
        )
        assert status_of(record) == before


def test_effect_page_of_a_settled_effect_shows_its_receipt_and_no_form(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    html = admin_client.get(change_url(world["settled"])).content.decode()
    receipt = EffectReceipt.objects.get(effect_id=world["settled"].effect_id)
    assert 'id="effect-receipt"' in html
    assert str(receipt.pk) in html
    assert 'id="resolve-form"' not in html
    assert "eb-tone-settled" in html


def test_resolve_from_the_effect_page_settles_with_reason_and_evidence(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    record = world["unsafe"]
    url = reverse("admin:effect_broker_effectintent_resolve", args=[record.effect_id])
    done = admin_client.post(
        url,
        {
            "resolution": "succeeded",
            "reason": "seen in the dashboard",
            "evidence": '{"source": "dashboard", "reference": "ch_9"}',
            "external_id": "ch_9",
        },
    )
    assert done.status_code == 302
    assert done["Location"] == change_url(record)
    assert status_of(record)[0] is S.SUCCEEDED
    page = admin_client.get(change_url(record)).content.decode()
    assert "seen in the dashboard" in page  # the reason is on the timeline
    assert "resolved_succeeded" in page
    assert 'class="eb-chain-ok"' in page


def test_a_forged_requeue_of_an_unsafe_effect_is_refused_by_the_service(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    record = world["unsafe"]
    before = status_of(record)
    url = reverse("admin:effect_broker_effectintent_resolve", args=[record.effect_id])
    refused = admin_client.post(
        url,
        {
            "resolution": "not_committed",
            "reason": "nothing there",
            "evidence": '{"source": "export", "checked_at": "2026-12-03T21:00:00Z"}',
        },
    )
    assert refused.status_code == 200
    assert "unsafe_never_requeued" in refused.content.decode() or (
        "never resent under the same operation key" in refused.content.decode()
    )
    assert status_of(record) == before


def test_user_without_resolve_permission_sees_no_form_and_cannot_post(
    client: Client, world: dict[str, EffectRecord]
) -> None:
    record = world["unsafe"]
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["view_effectintent", "change_effectintent"]
        )
    )
    client.force_login(viewer)
    page = client.get(change_url(record))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="resolve-form"' not in html
    assert 'id="fork-form"' not in html
    assert 'id="no-resolve-permission"' in html
    assert "resolve…" not in client.get(reverse(QUEUE)).content.decode()
    for name in ("resolve", "fork"):
        url = reverse(f"admin:effect_broker_effectintent_{name}", args=[record.effect_id])
        posted = client.post(
            url,
            {
                "resolution": "failed",
                "reason": "x",
                "new_operation_key": "k2",
                "evidence": '{"source": "s", "checked_at": "2026-12-03T21:00:00Z"}',
            },
        )
        assert posted.status_code == 403
    assert status_of(record) == (S.OUTCOME_UNKNOWN, record.version)


def test_the_effect_page_and_the_resolve_page_show_the_amount(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    # Given an unsafe effect whose contract previews its amount (issue 20: the
    # operator decided blind, the preview collapsed and absent from the resolve form)
    record = world["unsafe"]
    shown = "<code>amount_minor</code>: <strong>100</strong>"
    # Then the effect page shows it in its summary, first thing on the page
    html = admin_client.get(change_url(record)).content.decode()
    summary = html[html.index('id="effect-summary"') : html.index('id="chain"')]
    assert shown in summary
    # And so does the resolve page, next to the choices
    resolve = reverse("admin:effect_broker_effectintent_resolve", args=[record.effect_id])
    assert shown in admin_client.get(resolve).content.decode()


def test_reading_the_full_arguments_is_an_event_on_the_chain(
    admin_client: Client, world: dict[str, EffectRecord]
) -> None:
    # Given an effect waiting for an operator, and its arguments page
    record = world["unsafe"]
    url = reverse("admin:effect_broker_effectintent_arguments", args=[record.effect_id])
    before = EffectEvent.objects.filter(effect_id=record.effect_id).count()
    page = admin_client.get(url).content.decode()
    # Then nothing is decrypted before the operator gives a reason
    assert 'id="effect-arguments"' not in page
    assert EffectEvent.objects.filter(effect_id=record.effect_id).count() == before
    # When the operator asks with a reason
    shown = admin_client.post(url, {"reason": "check the order before resolving"})
    html = shown.content.decode()
    # Then the arguments are shown, and the read is the chain's newest event
    arguments = html[html.index('id="effect-arguments"') :]
    assert f"&quot;ref&quot;: &quot;{record.operation_key}&quot;" in arguments
    last = EffectEvent.objects.filter(effect_id=record.effect_id).latest("sequence")
    assert (last.event_type, last.actor) == ("arguments_read", "admin")
    assert last.metadata["reason"] == "check the order before resolving"
    assert last.old_status == last.new_status == S.OUTCOME_UNKNOWN.value
    assert verify_event_chain(record.effect_id) == before + 1


def test_full_arguments_are_refused_once_settled_and_without_the_permission(
    admin_client: Client, client: Client, world: dict[str, EffectRecord]
) -> None:
    # A settled effect: refused with the service's reason, nothing shown or written
    settled = world["settled"]
    url = reverse("admin:effect_broker_effectintent_arguments", args=[settled.effect_id])
    before = EffectEvent.objects.filter(effect_id=settled.effect_id).count()
    html = admin_client.post(url, {"reason": "curious"}).content.decode()
    assert "[illegal_transition]" in html
    assert 'id="effect-arguments"' not in html
    assert EffectEvent.objects.filter(effect_id=settled.effect_id).count() == before
    # Staff who may view effects but not resolve them: 403, nothing written
    record = world["unsafe"]
    viewer = User.objects.create_user("viewer2", password="pw", is_staff=True)
    viewer.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_effectintent"])
    )
    client.force_login(viewer)
    url = reverse("admin:effect_broker_effectintent_arguments", args=[record.effect_id])
    assert client.post(url, {"reason": "curious"}).status_code == 403
    assert status_of(record) == (S.OUTCOME_UNKNOWN, record.version)


# --- tenants ----------------------------------------------------------------------


def test_tenant_added_in_the_admin_gets_an_api_key_shown_once(
    admin_client: Client, db: None
) -> None:
    response = admin_client.post(
        reverse("admin:effect_broker_tenant_add"), {"name": "  globex  "}
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    html = response.content.decode()
    match = re.search(r'id="tenant-api-key"[^>]*>(eb_[A-Za-z0-9_-]+)<', html)
    assert match, html
    key = match.group(1)
    tenant = Tenant.objects.get(name="globex")
    # The key works, and only its hash is stored
    assert tenants.authenticate(key) == tenant
    assert tenant.api_key_hash == tenants.hash_api_key(key)
    # It is never shown again: not on the tenant's page, not in the list
    assert (
        key
        not in admin_client.get(
            reverse("admin:effect_broker_tenant_change", args=[tenant.pk])
        ).content.decode()
    )
    assert (
        key
        not in admin_client.get(
            reverse("admin:effect_broker_tenant_changelist")
        ).content.decode()
    )


def test_duplicate_tenant_name_is_a_form_error_not_an_integrity_error(
    admin_client: Client, db: None
) -> None:
    tenants.create_tenant("acme")
    response = admin_client.post(
        reverse("admin:effect_broker_tenant_add"), {"name": "acme"}
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "A tenant named &#x27;acme&#x27; already exists" in html
    assert "errornote" in html
    assert 'id="tenant-api-key"' not in html
    assert Tenant.objects.filter(name="acme").count() == 1


def test_renaming_a_tenant_to_a_taken_name_is_a_form_error(
    admin_client: Client, db: None
) -> None:
    tenants.create_tenant("acme")
    other, _ = tenants.create_tenant("globex")
    response = admin_client.post(
        reverse("admin:effect_broker_tenant_change", args=[other.pk]),
        {"name": "acme", "disabled": ""},
    )
    assert response.status_code == 200
    assert "already exists" in response.content.decode()
    assert Tenant.objects.get(pk=other.pk).name == "globex"


# --- static files and /docs -------------------------------------------------------


def test_collectstatic_output_is_served_by_whitenoise(tmp_path: Path, db: None) -> None:
    # Given the static files collected as a production image would
    root = tmp_path / "static"
    with override_settings(
        STATIC_ROOT=root,
        WHITENOISE_USE_FINDERS=False,
        WHITENOISE_AUTOREFRESH=False,
        DEBUG=False,
    ):
        call_command("collectstatic", interactive=False, verbosity=0)
        assert (root / "admin" / "css" / "base.css").is_file()
        assert (root / "ninja" / "swagger-ui-bundle.js").is_file()
        assert (root / "effect_broker" / "admin" / "console.css").is_file()
        # When served with finders off (production): WhiteNoise answers from the root
        fresh = Client()
        for asset in (
            "/static/admin/css/base.css",
            "/static/ninja/swagger-ui-bundle.js",
            "/static/effect_broker/admin/console.css",
        ):
            response = fresh.get(asset)
            try:
                assert response.status_code == 200, asset
                body = b"".join(response.streaming_content)  # type: ignore[attr-defined]
            finally:
                response.close()  # a file response holds the file open until closed
            assert body == (root / asset.removeprefix("/static/")).read_bytes()


def test_docs_load_swagger_from_the_broker_not_a_cdn(client: Client, db: None) -> None:
    html = client.get("/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html
    assert "/static/ninja/swagger-ui.css" in html
    assert "cdn" not in html.lower()
    assert not re.search(r'(src|href)="https?://', html)
