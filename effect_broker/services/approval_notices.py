"""The optional approval webhook: tell operators that an effect waits for them.

Issue 24, item 5. With ``EFFECT_BROKER_APPROVAL_WEBHOOK_URL`` (and its
``EFFECT_BROKER_APPROVAL_WEBHOOK_SECRET``) set, every effect that starts waiting for
an approval gets a ``notify_approval`` job, committed with the write that made it wait
(its reservation, or the worker's ``approval_invalidated``). The job, never the
request that submitted the effect, POSTs one JSON document to the URL; an answer
other than 2xx, or none, fails the job and procrastinate retries it with a growing
delay (``effect_broker.tasks``). A job that finds the effect decided already sends
nothing.

The document is Slack-compatible (``text`` and ``blocks``, what an incoming webhook
takes) and carries the same facts for machines under ``effect_broker``: the effect
id, the tool and contract, the deadline, the approval page's URL (when
``EFFECT_BROKER_PUBLIC_URL`` says where the broker is), and the effect's preview - the
contract's ``preview_fields``, redacted as everywhere else. Never the arguments
themselves, a secret, a key or the operation key.

It is signed like Stripe's webhooks: ``X-Effect-Broker-Signature: t=<unix time>,
v1=<hex HMAC-SHA256(secret, "<t>.<body>")>``; a receiver recomputes it over the raw
body and refuses an old ``t`` (docs/how-to/approvals.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Any

import httpx
from django.conf import settings
from django.urls import reverse

from effect_broker import store
from effect_broker.domain.records import EffectRecord
from effect_broker.domain.states import EffectStatus
from effect_broker.services.runtime import Runtime, get_runtime

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Effect-Broker-Signature"
#: One POST's bound, in seconds (connect, then the whole answer).
TIMEOUT = httpx.Timeout(10.0, connect=5.0)


def configured() -> bool:
    """Whether a webhook is set (its secret is then required by the settings)."""
    return bool(getattr(settings, "EFFECT_BROKER_APPROVAL_WEBHOOK_URL", ""))


def ask_for_notice(rt: Runtime, effect_id: str) -> None:
    """Defer the notice of an effect that (again) waits for approval, in the caller's
    transaction; nothing when no webhook is configured."""
    if configured():
        rt.scheduler.notify_approval(effect_id)


def approval_url(effect_id: str) -> str | None:
    """The approval page (the admin's effect page) when the broker knows its public
    URL, else None: a relative link would resolve against the wrong host."""
    base = str(getattr(settings, "EFFECT_BROKER_PUBLIC_URL", "") or "").rstrip("/")
    if not base:
        return None
    page = reverse("admin:effect_broker_effectintent_change", args=[effect_id])
    return f"{base}{page}#approval"


def _mrkdwn(value: object) -> str:
    # Slack's three control characters; values are short scalars (the preview).
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def notice(record: EffectRecord) -> dict[str, Any]:
    """The document POSTed for ``record``: facts and preview only (module docstring)."""
    url = approval_url(record.effect_id)
    deadline = record.next_action_at.isoformat() if record.next_action_at else None
    contract = f"{record.contract_name}@{record.contract_version}"
    preview = dict(record.arguments_preview)
    where = f"<{url}|approve or deny>" if url else "approve or deny it in the admin"
    headline = (
        f"Approval needed: {_mrkdwn(record.tool)} ({_mrkdwn(contract)}), effect "
        f"{record.effect_id}, waits until {deadline} - {where}"
    )
    fields = [
        {"type": "mrkdwn", "text": f"*{_mrkdwn(name)}*\n{_mrkdwn(value)}"}
        for name, value in preview.items()
    ][:10]  # a section holds at most 10 fields
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": headline}}
    ]
    if fields:
        blocks.append({"type": "section", "fields": fields})
    return {
        "text": headline,
        "blocks": blocks,
        "effect_broker": {
            "event": "approval_requested",
            "effect_id": record.effect_id,
            "tool": record.tool,
            "contract": contract,
            "safety_class": record.safety.value,
            "approval_deadline": deadline,
            "approval_url": url,
            "preview": preview,
        },
    }


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Effect-Broker-Signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def send_notice(
    effect_id: str,
    *,
    runtime: Runtime | None = None,
    transport: httpx.BaseTransport | None = None,
) -> str:
    """POST the notice of ``effect_id``; return what happened ("sent", "not
    awaiting", "not configured"). Raises on a failed POST, so its job is retried."""
    if not configured():
        return "not configured"
    record = store.load_effect_for_worker(effect_id)
    if record.status is not EffectStatus.AWAITING_APPROVAL:
        return "not awaiting"  # decided meanwhile: nobody needs to be asked
    rt = runtime or get_runtime()
    body = json.dumps(notice(record), ensure_ascii=False, separators=(",", ":")).encode()
    secret = str(settings.EFFECT_BROKER_APPROVAL_WEBHOOK_SECRET)
    sent_at = int(rt.clock.now().timestamp())
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature(secret, sent_at, body),
        "User-Agent": "effect-broker approval notice",
    }
    url = str(settings.EFFECT_BROKER_APPROVAL_WEBHOOK_URL)
    # No redirects and no retries here: the job's retry strategy owns retrying.
    with httpx.Client(
        timeout=TIMEOUT, follow_redirects=False, transport=transport
    ) as client:
        answer = client.post(url, content=body, headers=headers)
    if not answer.is_success:
        logger.warning(
            "approval notice refused; the job will be retried",
            extra={
                "action": "approval_notice",
                "effect_id": record.effect_id,
                "http_status": answer.status_code,
            },
        )
        answer.raise_for_status()
        raise httpx.HTTPError(f"approval webhook answered {answer.status_code}")
    logger.info(
        "approval notice sent",
        extra={"action": "approval_notice", "effect_id": record.effect_id},
    )
    return "sent"
