"""The ``effect-broker`` console script: Django's management commands, friendlier.

``effect-broker <cmd>`` and ``python manage.py <cmd>`` are the same thing. The one
difference is error handling: a domain error (bad configuration, bad input) prints one
readable line and exits non-zero instead of showing a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

#: Where an installed wheel keeps the Django project (config/) and the runnable
#: examples (pyproject.toml: they are not top-level packages in site-packages).
PROJECT_DIR = Path(__file__).resolve().parent / "_project"


def use_bundled_project() -> None:
    """Make ``config`` and ``examples`` importable in this process and its children.

    Only the console script does this, in its own process: an installed wheel must
    not put packages with such common names on every interpreter's path. A checkout
    (editable install) has no ``_project`` and imports them from the checkout.
    """
    if not PROJECT_DIR.is_dir():
        return
    path = str(PROJECT_DIR)
    if path not in sys.path:
        sys.path.insert(0, path)
    inherited = os.environ.get("PYTHONPATH", "")
    if path not in inherited.split(os.pathsep):
        # Children (workers, the target service, uvicorn) import them by name too.
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (path, inherited) if p)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a management command; return the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    use_bundled_project()
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
    except BrokenPipeError:
        # `effect-broker effects list | head`: the reader has what it wanted. Stop
        # quietly, as a Unix tool killed by SIGPIPE would (128 + 13), and point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        _discard_stdout()
        return 141
    except Exception as exc:  # never a traceback to a user, unless they ask for it
        if os.environ.get("EFFECT_BROKER_DEBUG"):
            raise
        first_line = (str(exc).strip().splitlines() or [""])[0]
        if _is_unmigrated(exc):
            sys.stderr.write(
                f"effect-broker: error [database]: {first_line}: the database is not "
                "migrated; run `effect-broker migrate` first\n"
            )
            return 1
        sys.stderr.write(
            f"effect-broker: error [{_category(exc)}]: {type(exc).__name__}: "
            f"{first_line} (set EFFECT_BROKER_DEBUG=1 for the traceback)\n"
        )
        return 1
    return 0


def _discard_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _is_unmigrated(exc: Exception) -> bool:
    """True for "relation ... does not exist" on one of the broker's own tables."""
    from django.db import ProgrammingError
    from psycopg import errors

    return isinstance(exc, ProgrammingError) and isinstance(
        exc.__cause__, errors.UndefinedTable
    )


def _category(exc: Exception) -> str:
    from django.db import DatabaseError

    return "database" if isinstance(exc, DatabaseError) else "internal"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
