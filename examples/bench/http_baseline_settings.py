"""Settings of the HTTP bench's "before" API process: the project's settings with the
middleware exactly as on main before issue 13 (session, auth and messages on every
route). Run without a process role (``cli``), so it has no pool and a new connection
per request, and served by Django's own ASGI handler (``uvicorn --factory
django.core.asgi:get_asgi_application``), so no in-flight limit either.
"""

from config.settings import *  # noqa: F403

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
