"""A ``postgresql://`` URL for a Django DATABASES entry.

Kept in the package rather than the project's settings package: broker code running
inside another Django project (the in-process client) must not import a top-level
``config``, which would be that project's own.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode


def url_from_settings(settings: dict[str, Any], *, dbname: str | None = None) -> str:
    """A ``postgresql://`` URL for a Django DATABASES entry (unix sockets included).

    Child processes (workers, the target service, the crash matrix) get the exact
    database the parent uses through ``DATABASE_URL``.
    """
    user = quote(settings.get("USER") or "", safe="")
    password = settings.get("PASSWORD") or ""
    auth = user + (f":{quote(password, safe='')}" if password else "")
    host, port = settings.get("HOST") or "", str(settings.get("PORT") or "")
    query: dict[str, str] = {
        key: str(value)
        for key, value in (settings.get("OPTIONS") or {}).items()
        if isinstance(value, str | int)
    }
    if host.startswith("/"):
        # A socket directory cannot sit in the authority part; libpq reads ?host=.
        netloc = f"{auth}@" if auth else ""
        query["host"] = host
        if port:
            query["port"] = port
    else:
        netloc = (f"{auth}@" if auth else "") + host + (f":{port}" if port else "")
    name = quote(dbname or settings["NAME"], safe="")
    # quote_via=quote: a space is %20; libpq reads a "+" literally (the session
    # timeouts travel as options=-c lock_timeout=... -c ...).
    query_string = urlencode(query, quote_via=quote)
    return f"postgresql://{netloc}/{name}" + (f"?{query_string}" if query else "")
