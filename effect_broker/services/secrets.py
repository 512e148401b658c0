"""Where a dispatching worker finds the secrets that arguments refer to.

``{"$secret": "env:NAME"}`` reads the worker's environment variable
``EFFECT_BROKER_SECRET_<NAME>``. The prefix is the boundary: a reference can reach
only variables an operator provisioned as secrets for effects, never the master key,
the database URL or anything else in the worker's environment. Which tenant may name
which secret is the contract's to say (``secrets``, ``tenant_secrets``; refused at
submit otherwise, domain/secret_refs.py): the worker resolves only declared ones.

``{"$secret": "file:NAME"}`` reads ``<EFFECT_BROKER_SECRETS_DIR>/<tenant id>/NAME``
(one trailing newline stripped): file secrets are per tenant, and a name is one path
segment (domain/secret_refs.py), so a reference cannot leave the tenant's directory.

A missing secret raises ``SecretUnavailableError`` naming the reference and where it
was looked for, never a value. The message becomes the effect's reason, which the
tenant reads in its history: it names the file relative to the tenant's directory,
and only the operator's log has the absolute path (issue 19, item 12).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from effect_broker.domain.errors import SecretUnavailableError
from effect_broker.domain.secret_refs import SecretRef

logger = logging.getLogger(__name__)

ENV_PREFIX = "EFFECT_BROKER_SECRET_"


@dataclass(frozen=True)
class SecretSource:
    """The worker's secrets: its environment (by prefix) and a per-tenant directory."""

    directory: Path | None = None
    environ: Mapping[str, str] | None = None  # None: the process environment

    def lookup(self, tenant_id: str, ref: SecretRef) -> str:
        if ref.scheme == "env":
            return self._from_env(ref)
        return self._from_file(tenant_id, ref)

    def _from_env(self, ref: SecretRef) -> str:
        environ = os.environ if self.environ is None else self.environ
        variable = ENV_PREFIX + ref.name
        value = environ.get(variable)
        if value is None:
            raise SecretUnavailableError(
                f"secret {ref.text} is unavailable: {variable} is not set on this worker"
            )
        return value

    def _from_file(self, tenant_id: str, ref: SecretRef) -> str:
        if self.directory is None:
            raise SecretUnavailableError(
                f"secret {ref.text} is unavailable: file secrets need "
                "EFFECT_BROKER_SECRETS_DIR on the worker"
            )
        path = self.directory / tenant_id / ref.name
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            logger.warning(
                "secret file cannot be read",
                extra={
                    "action": "secret_unavailable",
                    "path": str(path),
                    "reason": reason,
                },
            )
            raise SecretUnavailableError(
                f"secret {ref.text} is unavailable: the file {ref.name} in this "
                f"tenant's secrets directory cannot be read ({reason})"
            ) from None
        return text.removesuffix("\n")


def from_settings() -> SecretSource:
    from django.conf import settings

    directory = getattr(settings, "EFFECT_BROKER_SECRETS_DIR", "") or ""
    return SecretSource(directory=Path(directory) if directory else None)
