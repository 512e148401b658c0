"""Settings of the bench's served API processes: the project's own, plus one bare
Django view (``examples.bench.served_urls``) to compare a submit with what the
framework alone costs on the same server (issue 25)."""

from config.settings import *  # noqa: F403

ROOT_URLCONF = "examples.bench.served_urls"
