"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.engine.harness import Bench, engine_bench


@pytest.fixture
def bench(db: None) -> Iterator[Bench]:
    """The engine bench: a tenant, simulated targets and a controllable clock."""
    with engine_bench() as b:
        yield b
