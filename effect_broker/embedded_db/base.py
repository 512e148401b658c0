"""PostgreSQL backend that makes sure the embedded server runs before connecting.

Settings only know where the server *will* listen; starting it there would make every
management command (even ``--help``) pay for it. ``get_connection_params`` is the one
place both Django connections and procrastinate's worker connector pass through
(``procrastinate.contrib.django.utils.connector_params``), so the server starts there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.backends.postgresql import base as postgresql

from effect_broker import embedded_pg


class DatabaseWrapper(postgresql.DatabaseWrapper):
    """The stock PostgreSQL wrapper plus a lazy ``embedded_pg.ensure_running()``."""

    def get_connection_params(self) -> dict[str, Any]:
        # A settings entry may name another embedded instance (the crash matrix runs its
        # own, so that restarting it disturbs nobody else).
        project_dir = self.settings_dict.get("EMBEDDED_PROJECT_DIR")
        server = embedded_pg.ensure_running(Path(project_dir) if project_dir else None)
        params = super().get_connection_params()
        # In TCP mode a taken port is replaced at start; trust the running server over
        # what settings computed at import time.
        params["host"] = server.host
        params["port"] = server.port
        # The first connection of a fresh server goes to a database that may not exist.
        if self.settings_dict["NAME"] and not getattr(self, "_eb_db_ready", False):
            dbname = params.get("dbname")
            if dbname and not str(dbname).startswith("test_"):
                embedded_pg.ensure_database(server, str(dbname))
            self._eb_db_ready = True
        return params
