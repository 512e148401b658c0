"""The set-up shared by tests that run real worker processes against the target service:
no old procrastinate jobs, a fresh target in its own schema, contracts bound to it, this
process's runtime on those contracts, and a tenant."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import connection

from config.database import url_from_settings
from effect_broker.domain.contracts import load_contracts
from effect_broker.models import Tenant
from effect_broker.services import runtime
from effect_broker.services.tenants import create_tenant
from examples.crash_matrix.contracts import write_contracts
from examples.crash_matrix.target_client import TargetProcess, start_target
from tests.job_tables import forget_old_jobs


@contextmanager
def target_world(
    tmp_path: Path, *, schema: str, tenant_prefix: str
) -> Iterator[tuple[TargetProcess, Path, str, Tenant]]:
    """(target, contracts file, database URL, tenant); the target stops afterwards."""
    connection.ensure_connection()
    forget_old_jobs()
    url = url_from_settings(connection.settings_dict)
    target = start_target(url, settlement_delay="500ms", schema=schema)
    target.reset()
    contracts = write_contracts(tmp_path / "contracts.toml", target.url, timeout="15s")
    runtime.reset()
    try:
        with runtime.override(registry=load_contracts(contracts)):
            tenant = create_tenant(f"{tenant_prefix}-{uuid.uuid4().hex[:6]}")[0]
            yield target, contracts, url, tenant
    finally:
        runtime.reset()
        target.stop()
