"""The API process as served before issue 25, for the bench's side-by-side figures:
``config.asgi``'s guards (query credentials, body limits, in-flight limit, ``/mcp``)
around Django's stock ASGI handler, whose middleware chain hops to the sync thread
for each hook of Django's own middleware and around WhiteNoise's (sync only). The
only other difference from then: ``/healthz`` is an async view in both.
"""

from django.core.handlers.asgi import ASGIHandler

from config.asgi import served

application = served(ASGIHandler())
