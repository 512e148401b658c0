"""The ``effect-broker`` console script: Django's management commands, friendlier.

``effect-broker <cmd>`` and ``python manage.py <cmd>`` are the same thing. The one
difference is error handling: a domain error (bad configuration, bad input) prints one
readable line and exits non-zero instead of showing a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run a management command; return the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    from config.capacity import ROLE_ENV, role_for_command

    # Before settings load: a worker gets the workers' connection pool, any other
    # command none (config/capacity.py).
    os.environ[ROLE_ENV] = role_for_command(args)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from effect_broker.domain.errors import EffectBrokerError

    try:
        from django.core.management import execute_from_command_line

        execute_from_command_line(["effect-broker", *args])
    except EffectBrokerError as exc:
        sys.stderr.write(f"effect-broker: error [{exc.code}]: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("effect-broker: interrupted\n")
        return 130
    except Exception as exc:  # never a traceback to a user, unless they ask for it
        if os.environ.get("EFFECT_BROKER_DEBUG"):
            raise
        first_line = (str(exc).strip().splitlines() or [""])[0]
        sys.stderr.write(
            f"effect-broker: error [{_category(exc)}]: {type(exc).__name__}: "
            f"{first_line} (set EFFECT_BROKER_DEBUG=1 for the traceback)\n"
        )
        return 1
    return 0


def _category(exc: Exception) -> str:
    from django.db import DatabaseError

    return "database" if isinstance(exc, DatabaseError) else "internal"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
