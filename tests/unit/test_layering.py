"""The use cases never import the delivery layer (STYLE "Layering", "Wiring in one
place"): services, the store and the scheduler they use reach jobs by task name, so
``services -> scheduling -> tasks -> services`` cannot come back as a hidden cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "effect_broker"
USE_CASES = sorted(
    [
        *(PACKAGE / "services").glob("*.py"),
        *(PACKAGE / "store").glob("*.py"),
        PACKAGE / "scheduling.py",
    ]
)
DELIVERY = (
    "effect_broker.tasks",
    "effect_broker.api",
    "effect_broker.admin",
    "effect_broker.mcp",
)
MCP_SURFACE = sorted((PACKAGE / "mcp").glob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every absolute module ``path`` imports, at any nesting level (function-level
    imports included: they hid the cycle before)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize(
    "path", USE_CASES, ids=lambda p: p.relative_to(PACKAGE).as_posix()
)
def test_use_cases_do_not_import_the_delivery_layer(path: Path) -> None:
    leaks = sorted(
        name
        for name in _imports(path)
        if name.startswith(DELIVERY) or name.startswith("effect_broker.management")
    )
    assert leaks == [], f"{path.name} imports the delivery layer: {leaks}"


@pytest.mark.parametrize("path", MCP_SURFACE, ids=lambda p: p.name)
def test_the_mcp_surface_calls_services_never_the_store(path: Path) -> None:
    # STYLE "Layering": the MCP server is a surface like api.py.
    leaks = sorted(
        name
        for name in _imports(path)
        if name == "effect_broker.store" or name.startswith("effect_broker.store.")
    )
    assert leaks == [], f"{path.name} reaches past the services: {leaks}"


#: The console script's own entry points: they run in the broker's process with the
#: broker's settings, so they may reach the project packages `config` and `examples`.
ENTRY_POINTS = ("cli.py", "serving.py", "management/")
LIBRARY = sorted(
    path
    for path in PACKAGE.rglob("*.py")
    if not path.relative_to(PACKAGE).as_posix().startswith(ENTRY_POINTS)
    and "migrations" not in path.parts
)


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_the_library_never_imports_the_project_packages(path: Path) -> None:
    # Inside another Django project (the in-process client), a top-level `config` or
    # `examples` is that project's own: importing it would load the wrong module.
    leaks = sorted(
        name for name in _imports(path) if name.split(".")[0] in {"config", "examples"}
    )
    assert leaks == [], f"{path.name} imports the project packages: {leaks}"
