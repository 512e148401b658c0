"""Issue 22's acceptance for MCP upstreams that answer in text (items 2 and 3).

A real worker process SIGKILLs itself right after the upstream MCP server (a stdio
server written in the tests, ``tests/contract/mcp_text_server.py``, that answers in
text as common servers do) created the record, so the answer is lost with the worker.
A second worker recovers the effect:

* reconcilable: its lookup tool answers in text ("Record eb-...: id rec_1" / "no
  record named ..."), read by ``[contract.upstream.lookup_answer]``: the effect
  converges to ``succeeded`` with the one record;
* idempotent: the resend under the same key (a name, ``key_template = "eb-{key}"``,
  ``key_alphabet = "hex"``) is answered "already exists", read by
  ``[contract.upstream.answer]`` as the commit found again: ``succeeded``.

The upstream's own store (its SQLite file) holds exactly one record either way.
"""

from __future__ import annotations

import sqlite3
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from config.database import url_from_settings
from effect_broker import store
from effect_broker.domain.contracts import load_contracts
from effect_broker.domain.keys import spell_key
from effect_broker.domain.payload_crypto import decrypt
from effect_broker.domain.records import EffectRecord, EffectRequest
from effect_broker.domain.states import EffectStatus
from effect_broker.models import EffectReceipt
from effect_broker.services import runtime
from effect_broker.services.payloads import result_aad
from effect_broker.services.runtime import configured_keyring
from effect_broker.services.submission import submit
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.workers import WorkerProcess, broker_env, wait_until
from tests.job_tables import forget_old_jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def contracts_toml(records: Path) -> str:
    upstream = f"""command = "{sys.executable}"
args = ["-m", "tests.contract.mcp_text_server"]
cwd = "{ROOT}"
env = {{ RECORDS_DB = "{records}" }}
tool = "create_record"
key_argument = "name"
"""
    common = """retry_limit = 5
backoff_initial = "200ms"
backoff_max = "1s"
attempt_timeout = "10s"
adapter = "mcp"
key_template = "eb-{key}"
key_alphabet = "hex"
"""
    return f"""
[[contract]]
name = "records.create-idempotent"
version = "1"
tool = "create_record_idempotent"
safety = "idempotent"
key_retention = "24h"
{common}
[contract.upstream]
{upstream}
[contract.upstream.answer]
pattern = "Created|already exists"
committed = ["Created"]
already_done = ["already exists"]
id_pattern = "id (rec_[0-9]+)"

[[contract]]
name = "records.create-reconcilable"
version = "1"
tool = "create_record_reconcilable"
safety = "reconcilable"
settlement_bound = "1s"
{common}
[contract.upstream]
{upstream}lookup_tool = "find_record"

[contract.upstream.lookup_answer]
pattern = "^Record|no record named"
committed = ["Record"]
not_committed = ["no record named"]
id_pattern = "id (rec_[0-9]+)"
"""


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Path, Path, dict[str, str], object]]:
    connection.ensure_connection()
    forget_old_jobs()
    records = tmp_path / "records.db"
    contracts = tmp_path / "contracts.toml"
    contracts.write_text(contracts_toml(records), encoding="utf-8")
    assert settings.EFFECT_BROKER_MASTER_KEY is not None
    url = url_from_settings(connection.settings_dict)
    runtime.reset()
    try:
        with runtime.override(registry=load_contracts(contracts)):
            tenant = create_tenant(f"mcp-text-{uuid.uuid4().hex[:6]}")[0]
            env = broker_env(url, contracts, settings.EFFECT_BROKER_MASTER_KEY)
            yield records, contracts, env, tenant
    finally:
        runtime.reset()


def record_names(records: Path) -> list[str]:
    with sqlite3.connect(records) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM records ORDER BY n")]


def status_of(record: EffectRecord) -> EffectStatus:
    return store.load_effect_for_worker(record.effect_id).status


@pytest.mark.parametrize("safety", ["reconcilable", "idempotent"])
def test_a_worker_killed_after_the_upstream_created_the_record_converges_to_one(
    world: tuple[Path, Path, dict[str, str], object], safety: str
) -> None:
    records, _, env, tenant = world
    # Given a worker that SIGKILLs itself right after the upstream answered
    doomed = WorkerProcess(
        f"text-doomed-{safety}",
        {**env, "EFFECT_BROKER_FAILPOINTS": "after_target_commit"},
    )
    rescuer: WorkerProcess | None = None
    try:
        # When an effect is submitted
        effect = submit(
            tenant,  # type: ignore[arg-type]
            EffectRequest(
                operation_key=f"record:{uuid.uuid4().hex[:8]}",
                tool=f"create_record_{safety}",
                arguments={"order": "42", "amount_minor": 1999},
            ),
        ).effect
        assert effect is not None
        assert doomed.wait(60) == -9, doomed.log_tail()
        # the upstream created the record, and nobody heard its answer
        expected = "eb-" + spell_key(effect.downstream_key, "hex")
        assert record_names(records) == [expected]
        assert status_of(effect) is EffectStatus.DISPATCHING
        # and a second worker recovers it
        rescuer = WorkerProcess(f"text-rescuer-{safety}", env)
        wait_until(
            lambda: status_of(effect) is EffectStatus.SUCCEEDED,
            timeout=60,
            what=f"the {safety} effect to succeed",
        )
    finally:
        doomed.close()
        if rescuer is not None:
            rescuer.stop()
    # Then it succeeded with one receipt, and the upstream's own store holds one record
    assert record_names(records) == [expected]
    receipts = EffectReceipt.objects.filter(effect_id=effect.effect_id)
    assert receipts.count() == 1
    receipt = receipts.get()
    if safety == "reconcilable":
        # found by the text lookup, with the id read from "Record ...: id rec_1"
        assert receipt.external_id == "rec_1"
    else:
        # the resend's "already exists" is the evidence, kept with the receipt
        result = decrypt(
            configured_keyring(),
            receipt.result_key_id,
            receipt.result_ciphertext,
            aad=result_aad(effect.tenant_id, effect.operation_key),
        )
        assert b'"already_done":"already exists"' in result
        assert b"already exists" in result
