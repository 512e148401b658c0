"""WSGI entry point: ``effect-broker serve --wsgi`` (gunicorn's threaded workers).

The process is the API (``serve`` sets ``EFFECT_BROKER_PROCESS_ROLE=api``): it gets
the API's connection pool, and the pool tests a connection only when in doubt, as
under ASGI (config/asgi.py). A credential in the query string is refused here too.
What this mode lacks next to ASGI - the body deadlines, the in-flight limit's 503,
``/mcp`` - is listed in ``effect_broker.management.commands.serve``.
"""

import os
from typing import Any

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_application = get_wsgi_application()

from config.capacity import API, ROLE_ENV  # noqa: E402
from effect_broker.api.query_credentials import WsgiQueryCredentialGuard  # noqa: E402

application: Any = django_application
if os.environ.get(ROLE_ENV) == API:
    from effect_broker.store.pool_checks import use_on_django_pool

    use_on_django_pool()
    application = WsgiQueryCredentialGuard(django_application)
