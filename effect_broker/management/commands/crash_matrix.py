"""``manage.py crash_matrix``: the same as ``effect-broker demo crash-matrix``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from effect_broker.management.base import BrokerCommand
from effect_broker.management.crash_matrix_options import (
    add_crash_matrix_arguments,
    run_crash_matrix,
)


class Command(BrokerCommand):
    help = (
        "Kill real broker worker processes at every failpoint and count charges in the "
        "target's own table, next to a naive retry loop (same as 'demo crash-matrix')."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_crash_matrix_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        code = run_crash_matrix(self.stdout, options)
        if code:
            raise SystemExit(code)
