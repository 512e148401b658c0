"""The master keys: which one encrypts new payloads, which ones still decrypt old ones.

Spec "Durability and consistency mechanics": encrypted payloads carry a key id. A
master keyring is a small text file, one key per line::

    # effect-broker master keys: id, base64 of 32 bytes. The last line is current.
    k1 3q2+7w...=
    k2 u9F0Zk...=

New ciphertexts use the last key; every listed key still decrypts what it wrote
(``effect-broker keys rotate`` appends one, ``keys reencrypt`` moves old ciphertexts to
the current key). A file holding just one base64 key, as before rotation existed, is
the keyring ``k1 <that key>``: the id every ciphertext written before carries.

The FIRST key is also the hashing root: request hashes and tenants' downstream-key
HMAC keys are derived from it, and stay so after a rotation, because changing them
would change stored bindings (a replay would read as a payload conflict). Rotation
therefore protects payloads at rest; it does not retire the first key.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass

from effect_broker.domain.errors import ConfigurationError
from effect_broker.domain.keys import MASTER_KEY_BYTES

LEGACY_KEY_ID = "k1"
_KEY_ID = re.compile(r"k[1-9][0-9]{0,8}")
HEADER = (
    "# effect-broker master keys: id, base64 of 32 bytes. The last line is current;\n"
    "# the first is the hashing root and must stay. Keep this file secret (mode 600).\n"
)


@dataclass(frozen=True)
class MasterKeys:
    """Master keys in file order: the first is the hashing root, the last is current."""

    entries: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ConfigurationError("a master keyring needs at least one key")
        ids = [key_id for key_id, _ in self.entries]
        if len(set(ids)) != len(ids):
            raise ConfigurationError("a master keyring lists a key id twice")

    @property
    def current_id(self) -> str:
        return self.entries[-1][0]

    @property
    def hash_root(self) -> bytes:
        return self.entries[0][1]

    @property
    def by_id(self) -> dict[str, bytes]:
        return dict(self.entries)

    def rotated(self) -> MasterKeys:
        """This keyring plus a new random key, which becomes current."""
        highest = max(int(key_id[1:]) for key_id, _ in self.entries)
        new = (f"k{highest + 1}", secrets.token_bytes(MASTER_KEY_BYTES))
        return MasterKeys((*self.entries, new))

    def to_text(self) -> str:
        lines = [
            f"{key_id} {base64.b64encode(key).decode()}" for key_id, key in self.entries
        ]
        return HEADER + "\n".join(lines) + "\n"


def decode_key(text: str, *, source: str) -> bytes:
    """One base64 master key, exactly 32 bytes."""
    try:
        key = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigurationError(f"{source} is not valid base64") from exc
    if len(key) != MASTER_KEY_BYTES:
        raise ConfigurationError(
            f"{source} must decode to {MASTER_KEY_BYTES} bytes, got {len(key)}; "
            'generate one with: python -c "import os,base64;'
            'print(base64.b64encode(os.urandom(32)).decode())"'
        )
    return key


def parse_keyring(text: str, *, source: str) -> MasterKeys:
    """Parse a keyring file, or a file (or variable) holding one bare base64 key."""
    lines = [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(lines) == 1 and " " not in lines[0][1]:
        return MasterKeys(((LEGACY_KEY_ID, decode_key(lines[0][1], source=source)),))
    entries = []
    for number, line in lines:
        key_id, _, encoded = line.partition(" ")
        if not _KEY_ID.fullmatch(key_id):
            raise ConfigurationError(
                f"{source}:{number}: a key line is '<id> <base64 key>' with an id like "
                f"k1, k2; got {key_id!r}"
            )
        entries.append((key_id, decode_key(encoded, source=f"{source}:{number}")))
    return MasterKeys(tuple(entries))
