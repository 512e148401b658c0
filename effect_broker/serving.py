"""The ASGI application ``effect-broker serve`` runs: the API, plus its static files.

The admin's CSS and the API docs' assets are static files, and uvicorn serves none
(issue 11: "served by uvicorn, it has no CSS"). When WhiteNoise is in the middleware
it serves them (compressed, cached, from ``collectstatic``'s output) and this module
adds nothing. Without it, Django's own ``ASGIStaticFilesHandler`` serves them from
the installed apps, so ``serve`` never ships an admin without styles either way.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from config.asgi import application as api_application

WHITENOISE = "whitenoise.middleware.WhiteNoiseMiddleware"


def whitenoise_enabled() -> bool:
    """True when WhiteNoise serves static files from inside Django."""
    return WHITENOISE in settings.MIDDLEWARE


def _with_static_files(app: Any) -> Any:
    if whitenoise_enabled() or not settings.STATIC_URL:
        return app
    return ASGIStaticFilesHandler(app)


application = _with_static_files(api_application)
