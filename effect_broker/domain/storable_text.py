"""The one rule for text PostgreSQL refuses, applied to every client input.

PostgreSQL stores neither U+0000 (``text`` and ``jsonb`` both refuse it) nor a lone
UTF-16 surrogate (U+D800-U+DFFF: it has no UTF-8 encoding, so the driver cannot even
send it). Issue 12: a NUL in a body field, a query filter or an argument key reached a
statement and came back as 500 ``internal_error``. Every surface now runs its input
through ``require_storable`` before any service sees it, and refuses such text as
422 ``unstorable_text`` naming the field.
"""

from __future__ import annotations

import json
import re

from effect_broker.domain.errors import UnstorableTextError

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
#: Names of object keys are shown escaped and cut to this many characters.
_MAX_KEY_SHOWN = 64


def _described(char: str) -> str:
    return "NUL (U+0000)" if char == "\x00" else f"a lone surrogate (U+{ord(char):04X})"


def _key_shown(key: str) -> str:
    escaped = json.dumps(key)[1:-1]  # \u0000 and surrogates come out escaped
    return escaped if len(escaped) <= _MAX_KEY_SHOWN else escaped[:_MAX_KEY_SHOWN] + "..."


def _joined(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def find_unstorable(value: object, path: str = "") -> tuple[str, str, str] | None:
    """The first string in ``value`` (object keys included) PostgreSQL cannot store.

    Returns ``(field, what, character)``: the dotted path of the value, or of the
    object holding the key; ``"value"`` or ``"key"``; the offending character.
    """
    # An explicit stack: a deeply nested body must not cost a RecursionError here.
    stack: list[tuple[str, object]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            found = _UNSTORABLE.search(item)
            if found:
                return where, "value", found.group()
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                if isinstance(key, str) and (found := _UNSTORABLE.search(key)):
                    return where, "key", found.group()
                stack.append((_joined(where, _key_shown(str(key))), child))
        elif isinstance(item, list | tuple):
            indexed = list(enumerate(item))
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(indexed))
    return None


def require_storable(value: object, path: str = "") -> None:
    """Raise ``UnstorableTextError`` naming the field if ``value`` holds text
    PostgreSQL refuses."""
    found = find_unstorable(value, path)
    if found is None:
        return
    field, what, char = found
    if what == "value":
        place = field or "the value"
    else:
        place = f"a key of {field}" if field else "an object key"
    raise UnstorableTextError(
        f"{place} contains {_described(char)}, which cannot be stored",
        field=field,
    )
