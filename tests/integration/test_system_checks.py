"""Django's system checks: the full set passes, and the broker's commands run the part
that concerns a process serving no URL (``effect_broker.management.base``)."""

from __future__ import annotations

import importlib

import pytest
from django.core.checks import Tags
from django.core.management import call_command, get_commands, load_command_class

from effect_broker.management.base import NON_SERVING_CHECKS, BrokerCommand


def test_the_full_set_of_checks_passes_with_the_url_conf_loaded() -> None:
    # The URL conf (REST API, admin, MCP mount) is what the broker's commands skip;
    # `effect-broker check` and this test are where it is checked.
    importlib.import_module("config.urls")
    call_command("check", fail_level="WARNING", verbosity=0)


#: The broker's commands; ``createsuperuser`` is Django's own, with Django's checks.
BROKER_COMMANDS = sorted(
    n
    for n, app in get_commands().items()
    if app == "effect_broker"
    if n != "createsuperuser"
)


@pytest.mark.parametrize("name", BROKER_COMMANDS)
def test_every_broker_command_skips_only_the_serving_checks(name: str) -> None:
    command = load_command_class("effect_broker", name)
    if name == "serve":
        # It starts without the database; /readyz reports on it.
        assert command.requires_system_checks == []
        return
    assert isinstance(command, BrokerCommand), name
    assert command.requires_system_checks == NON_SERVING_CHECKS
    assert Tags.urls not in command.requires_system_checks
    assert Tags.models in command.requires_system_checks
