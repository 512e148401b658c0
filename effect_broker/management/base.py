"""What the broker's own commands share."""

from __future__ import annotations

from django.core.checks import Tags
from django.core.management.base import BaseCommand

#: The system checks a command that serves no URL runs before it starts: the models
#: and the installation. Django's full set also loads the URL conf to check it - the
#: REST API (django-ninja, pydantic, the MCP tools) and the admin's templates - which
#: was about 40% of the CPU of starting a worker or a CLI command, for code that
#: command never runs. `effect-broker check` runs the full set (and a test does).
NON_SERVING_CHECKS: list[str] = [
    Tags.models,
    Tags.compatibility,
    Tags.caches,
    Tags.async_support,
    Tags.signals,
]


class BrokerCommand(BaseCommand):
    """A management command of the broker's that serves no URL."""

    requires_system_checks = NON_SERVING_CHECKS
