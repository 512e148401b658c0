"""SecretRef: an argument that names a secret instead of carrying it (spec "Data model").

A caller writes ``{"$secret": "env:STRIPE_KEY"}`` (or ``"file:stripe-key"``) where a
secret value would go. The broker stores, hashes and previews the reference; only the
worker that dispatches the effect looks the value up, just before the send, so the
clear value is never in the ledger, the request hash, an event or a preview.

This module is the pure part: what a reference looks like, finding every reference in
a set of arguments (refusing malformed ones with the field they are at), and
substituting values through a lookup the caller supplies, and refusing references a
contract does not declare. Where values come from is the worker's business
(``services/secrets.py``).

Declaration (issue 19, item 11): a reference resolves only if the effect's contract
lists it (``secrets``, or ``tenant_secrets`` for one tenant). Without that, any tenant
could name any secret the worker holds and read it back through a target that echoes
its input, or probe which names exist from how its effects end. The refusal happens at
submit, before anything is looked up, so its answer is the same for a name the worker
has and one it has not.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from effect_broker.domain.errors import InvalidSecretRefError, SecretRefNotDeclaredError

SECRET_MEMBER = "$secret"  # noqa: S105 - the member name, not a secret
SCHEMES = ("env", "file")
#: env: a shell-style variable name; file: one path segment, never "." or "..".
_NAMES = {
    "env": re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}"),
    "file": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"),
}


@dataclass(frozen=True)
class SecretRef:
    """A parsed ``{"$secret": "<scheme>:<name>"}``."""

    scheme: str
    name: str

    @property
    def text(self) -> str:
        return f"{self.scheme}:{self.name}"


def is_secret_ref(value: object) -> bool:
    """True for an object that claims to be a reference (well formed or not)."""
    return isinstance(value, Mapping) and SECRET_MEMBER in value


def is_well_formed_ref(value: object) -> bool:
    """True only for a reference ``parse_ref`` accepts (one member, valid text)."""
    if not is_secret_ref(value):
        return False
    assert isinstance(value, Mapping)
    try:
        parse_ref(value, field="value")
    except InvalidSecretRefError:
        return False
    return True


def parse_ref(value: Mapping[str, Any], *, field: str) -> SecretRef:
    """Parse one reference object; raise ``InvalidSecretRefError`` naming ``field``."""
    if set(value) != {SECRET_MEMBER}:
        raise InvalidSecretRefError(
            f"{field}: a secret reference is an object with the one member "
            f'"{SECRET_MEMBER}", like {{"$secret": "env:STRIPE_KEY"}}',
            field=field,
        )
    text = value[SECRET_MEMBER]
    scheme, _, name = text.partition(":") if isinstance(text, str) else ("", "", "")
    if scheme not in SCHEMES or not _NAMES[scheme].fullmatch(name):
        raise InvalidSecretRefError(
            f"{field}: a secret reference is 'env:NAME' (a variable name) or "
            "'file:NAME' (one file name, no path)",
            field=field,
        )
    return SecretRef(scheme, name)


def parse_ref_text(text: object, *, field: str) -> SecretRef:
    """Parse ``"env:NAME"`` or ``"file:NAME"`` as a contract declares it."""
    return parse_ref({SECRET_MEMBER: text}, field=field)


def refuse_undeclared(
    found: list[tuple[str, SecretRef]], declared: frozenset[str], *, contract: str
) -> None:
    """Raise ``SecretRefNotDeclaredError`` for the first reference not in ``declared``.

    The message names the caller's field and the contract, never the reference's
    name, and nothing here asks whether the secret exists: a refused name that the
    worker holds and one it does not get the same answer (no probing).
    """
    for path, ref in found:
        if ref.text not in declared:
            raise SecretRefNotDeclaredError(
                f"{path}: this secret reference is not declared by contract "
                f"{contract} for this tenant; nothing was written",
                field=path,
                contract=contract,
            )


def find_refs(value: object, path: str = "arguments") -> list[tuple[str, SecretRef]]:
    """Every reference in ``value`` with its field path; malformed ones are refused."""
    found: list[tuple[str, SecretRef]] = []
    if isinstance(value, Mapping):
        if SECRET_MEMBER in value:
            return [(path, parse_ref(value, field=path))]
        for key, item in value.items():
            found.extend(find_refs(item, f"{path}.{key}"))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(find_refs(item, f"{path}[{index}]"))
    return found


def resolve_refs(value: Any, lookup: Callable[[SecretRef], str]) -> Any:
    """``value`` with every reference replaced by ``lookup(ref)``; the rest is copied
    as it is. ``lookup`` raises when a secret is unavailable."""
    if isinstance(value, Mapping):
        if SECRET_MEMBER in value:
            return lookup(parse_ref(value, field="arguments"))
        return {key: resolve_refs(item, lookup) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve_refs(item, lookup) for item in value]
    return value
