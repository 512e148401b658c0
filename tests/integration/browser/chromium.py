"""Debian's Chromium driven by Selenium, as Django's own admin tests drive a browser.

``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` come from the ``chromium`` and
``chromium-driver`` packages (``.ci/run`` installs them); ``EFFECT_BROKER_CHROMIUM``
and ``EFFECT_BROKER_CHROMEDRIVER`` point elsewhere. Where either is missing the browser
tests skip with that reason; nothing is downloaded (Selenium Manager is never asked:
the driver's path is always given).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _binary(env: str, *names: str) -> str | None:
    configured = os.environ.get(env, "").strip()
    if configured:
        return configured if Path(configured).is_file() else None
    for name in names:
        found = shutil.which(name) or (
            f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").is_file() else None
        )
        if found:
            return found
    return None


CHROMIUM = _binary("EFFECT_BROKER_CHROMIUM", "chromium", "chromium-browser")
CHROMEDRIVER = _binary("EFFECT_BROKER_CHROMEDRIVER", "chromedriver")


def unavailable_reason() -> str:
    """Why the browser tests cannot run here, or "" when they can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    if CHROMIUM is None:
        return "no Chromium: apt-get install -y chromium chromium-driver"
    if CHROMEDRIVER is None:
        return "no chromedriver: apt-get install -y chromium-driver"
    return ""


@dataclass
class Screenshots:
    """Where screenshots are kept: ``EFFECT_BROKER_SCREENSHOT_DIR``, else a fresh
    temporary directory (created on the first screenshot, kept after the run)."""

    taken: int = 0
    _directory: Path | None = field(default=None, repr=False)

    @property
    def directory(self) -> Path:
        if self._directory is None:
            configured = os.environ.get("EFFECT_BROKER_SCREENSHOT_DIR", "").strip()
            self._directory = (
                Path(configured)
                if configured
                else Path(tempfile.mkdtemp(prefix="effect-broker-screenshots-"))
            )
            self._directory.mkdir(parents=True, exist_ok=True)
        return self._directory

    def save(self, driver: Any, name: str) -> Path:
        """Save the browser's viewport as ``NAME.png`` and return its path."""
        path = self.directory / f"{name}.png"
        # The whole page, not the first screen: grow the window to the document's
        # height for the shot, then put it back.
        width, height = driver.get_window_size().values()
        full = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, max(height, min(int(full), 6000)))
        try:
            driver.save_screenshot(str(path))
        finally:
            driver.set_window_size(width, height)
        self.taken += 1
        return path


SCREENSHOTS = Screenshots()


def start_chromium() -> Any:
    """A headless Chromium with a fixed window, bounded page-load and script times."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        # Containers run as root and have a small /dev/shm.
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        # Offline by construction: every host name but the live server's address
        # fails to resolve, so a page that needs a CDN breaks here as it would on an
        # air-gapped host (issue 11: /docs was blank offline).
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
        "--disable-background-networking",
        "--no-first-run",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(10)
    return driver
