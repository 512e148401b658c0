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

WHITENOISE = "whitenoise.middleware.WhiteNoiseMiddleware"


def whitenoise_enabled() -> bool:
    """True when WhiteNoise serves static files from inside Django."""
    return WHITENOISE in settings.MIDDLEWARE


def with_static_files(app: Any) -> Any:
    """``app``, wrapped to serve ``STATIC_URL`` unless WhiteNoise already does."""
    if whitenoise_enabled() or not settings.STATIC_URL:
        return app
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    return ASGIStaticFilesHandler(app)


def __getattr__(name: str) -> Any:
    # ``application`` is built on first access (uvicorn's import of
    # "effect_broker.serving:application"): importing config.asgi declares this
    # process the API, which only the served process may do.
    if name == "application":
        from config.asgi import application as api_application

        app = with_static_files(api_application)
        globals()["application"] = app
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
