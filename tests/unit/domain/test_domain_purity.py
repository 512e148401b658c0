"""The domain layer stays pure Python: no Django, stdlib + rfc8785 + cryptography only.

STYLE "Layering": a unit test fails if any ``effect_broker/domain/*.py`` imports Django.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DOMAIN = Path(__file__).resolve().parents[3] / "effect_broker" / "domain"
MODULES = sorted(DOMAIN.glob("*.py"))
# jsonschema: contracts check an MCP face's schema when the file loads.
ALLOWED_THIRD_PARTY = {"rfc8785", "cryptography", "jsonschema"}


def _imported_modules(path: Path) -> list[str]:
    """Return every absolute module name ``path`` imports, at any nesting level."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif (
            isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__"
        ):
            names.append("<dynamic __import__>")
    return names


def test_given_domain_package_then_it_has_the_expected_modules() -> None:
    names = {path.stem for path in MODULES}
    assert {
        "__init__",
        "canonical",
        "contracts",
        "errors",
        "event_chain",
        "keys",
        "payload_crypto",
        "states",
    } <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_given_domain_module_then_it_never_imports_django(path: Path) -> None:
    django_imports = [
        name for name in _imported_modules(path) if name.split(".")[0] == "django"
    ]
    assert django_imports == []


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.name)
def test_given_domain_module_then_it_imports_only_stdlib_and_allowed_packages(
    path: Path,
) -> None:
    foreign = [
        name
        for name in _imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] not in ALLOWED_THIRD_PARTY
        and not name.startswith("effect_broker.domain")
    ]
    assert foreign == []


def test_given_fresh_interpreter_when_domain_is_imported_then_no_django_is_loaded() -> (
    None
):
    # The parent package is stubbed so this checks the domain alone, whatever
    # effect_broker/__init__.py (owned by another layer) may import.
    script = textwrap.dedent(
        f"""
        import sys, types
        package = types.ModuleType("effect_broker")
        package.__path__ = [{str(DOMAIN.parent)!r}]
        sys.modules["effect_broker"] = package
        import effect_broker.domain
        for path in {[path.stem for path in MODULES]!r}:
            if path != "__init__":
                __import__("effect_broker.domain." + path)
        loaded = sorted(
            name for name in sys.modules if name == "django" or name.startswith("django.")
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
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "clean"
