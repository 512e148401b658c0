"""Environment parsing for settings: booleans, the master key, production refusals."""

from __future__ import annotations

import base64
import os
import secrets
import sys
from pathlib import Path

from effect_broker.domain.errors import ConfigurationError
from effect_broker.domain.master_keys import MasterKeys, decode_key, parse_keyring

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name: str, *, default: bool) -> bool:
    """Read a boolean environment variable; anything unrecognised is an error."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{name} must be one of 1/0/true/false/yes/no, got {raw!r}")


def decode_master_key(text: str, *, source: str) -> bytes:
    """Decode a base64 master key and insist on exactly 32 bytes (AES-256, HKDF root)."""
    return decode_key(text, source=source)


def load_master_keys(
    base_dir: Path, *, production: bool
) -> tuple[MasterKeys | None, Path | None]:
    """The master keyring and the file it came from (None for the inline variable).

    ``EFFECT_BROKER_MASTER_KEY`` holds one key (id k1). ``EFFECT_BROKER_MASTER_KEY_FILE``
    holds one key or a keyring (domain/master_keys.py), which ``effect-broker keys
    rotate`` can extend. Development without either gets one generated once into
    ``.effect-broker/`` so that payloads written by one run can be read by the next.
    """
    inline = os.environ.get("EFFECT_BROKER_MASTER_KEY", "")
    if inline.strip():
        return parse_keyring(inline, source="EFFECT_BROKER_MASTER_KEY"), None
    key_file = os.environ.get("EFFECT_BROKER_MASTER_KEY_FILE", "")
    if key_file.strip():
        path = Path(key_file)
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(
                f"EFFECT_BROKER_MASTER_KEY_FILE {key_file!r} cannot be read: {exc}"
            ) from exc
        return parse_keyring(
            text, source=f"EFFECT_BROKER_MASTER_KEY_FILE {key_file}"
        ), path
    if production:
        return None, None
    dev_file = base_dir / ".effect-broker" / "dev-master.key"
    if not dev_file.exists():
        dev_file.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: two processes starting at once must not write two different keys.
        try:
            fd = os.open(dev_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write(base64.b64encode(secrets.token_bytes(32)).decode())
    return parse_keyring(
        dev_file.read_text(encoding="ascii"), source=str(dev_file)
    ), dev_file


def refuse_unsafe_production(
    *,
    production: bool,
    database_url: str,
    master_key: bytes | None,
    debug: bool,
    secret_key: str,
) -> None:
    """Exit with one clear line when production is missing a required setting."""
    if not production:
        return
    problems = []
    if not database_url.strip():
        problems.append("DATABASE_URL is unset")
    if master_key is None:
        problems.append(
            "EFFECT_BROKER_MASTER_KEY or EFFECT_BROKER_MASTER_KEY_FILE is unset"
        )
    if debug:
        problems.append("DEBUG is on")
    if len(secret_key) < 32 or secret_key.startswith("dev-insecure"):
        problems.append("SECRET_KEY is missing or too short (need 32+ characters)")
    if problems:
        # A settings module cannot return an error code; exiting is the one-line refusal.
        sys.stderr.write(
            "effect-broker: refusing to start in production: "
            + "; ".join(problems)
            + "\n"
        )
        raise SystemExit(2)
