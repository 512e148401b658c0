"""The SDK and the key helpers sit on the caller's side of the house (STYLE
"Layering"): they import nothing from Django, the store, the services, the models or
the API, so an agent process imports them without a settings module or a database.
The one exception is ``client/in_process.py``, the Django surface, loaded lazily."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "effect_broker"
CALLER_SIDE = sorted(
    [*(PACKAGE / "client").glob("*.py"), PACKAGE / "keys.py"],
)
#: The Django surface of the SDK (it calls the services), imported on first use only.
DJANGO_SURFACE = PACKAGE / "client" / "in_process.py"
FORBIDDEN = (
    "django",
    "ninja",
    "procrastinate",
    "effect_broker.store",
    "effect_broker.services",
    "effect_broker.models",
    "effect_broker.api",
    "effect_broker.adapters",
    "effect_broker.tasks",
    "effect_broker.scheduling",
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    "path",
    [p for p in CALLER_SIDE if p != DJANGO_SURFACE],
    ids=lambda p: p.relative_to(PACKAGE).as_posix(),
)
def test_caller_side_modules_import_no_framework_and_no_engine(path: Path) -> None:
    leaks = sorted(
        name
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    )
    assert leaks == []


def test_keys_imports_only_the_stdlib_and_the_domain() -> None:
    foreign = sorted(
        name
        for name in _imports(PACKAGE / "keys.py")
        if name.split(".")[0] not in sys.stdlib_module_names
        and not name.startswith("effect_broker.domain")
        and name != "__future__"
    )
    assert foreign == []


def test_a_fresh_interpreter_imports_the_sdk_and_keys_without_django() -> None:
    # No DJANGO_SETTINGS_MODULE, no database: what an agent process has.
    script = textwrap.dedent(
        """
        import sys
        import effect_broker.client as client, effect_broker.keys as keys
        client.BrokerClient, client.AsyncBrokerClient, keys.temporal_key
        loaded = sorted(
            n for n in sys.modules
            if n.split(".")[0] in {"django", "ninja", "procrastinate"}
            or n.startswith(("effect_broker.services", "effect_broker.store"))
        )
        print(",".join(loaded) or "clean")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=PACKAGE.parent,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "clean"
