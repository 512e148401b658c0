"""Browser tests: where their screenshots went, printed at the end of the run."""

from __future__ import annotations

import pytest

from tests.integration.browser.chromium import SCREENSHOTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SCREENSHOTS.taken:
        terminalreporter.write_line(
            f"browser screenshots ({SCREENSHOTS.taken}): {SCREENSHOTS.directory}"
        )
