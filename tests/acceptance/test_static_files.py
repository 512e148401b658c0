"""Static files as deployed: ``collectstatic`` then ``uvicorn config.asgi:application``
with ``EFFECT_BROKER_ENV=production`` (DEBUG off, no app finders), over a real socket.

Issue 11: served by uvicorn, the admin had no CSS, and ``/docs`` loaded Swagger UI from
a CDN, so it was blank offline. WhiteNoise now serves what ``collectstatic`` gathered
in ``EFFECT_BROKER_STATIC_ROOT``, and ``/docs`` names only those files. No database is
needed for either, so the process gets an address where nothing listens.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
ASSETS = (
    "admin/css/base.css",
    "ninja/swagger-ui-bundle.js",
    "ninja/swagger-ui.css",
    "effect_broker/admin/console.css",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    static_root = tmp_path_factory.mktemp("static")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECT_BROKER_")}
    env.update(
        EFFECT_BROKER_ENV="production",
        DATABASE_URL="postgresql://nobody@127.0.0.1:9/none",
        SECRET_KEY="static-files-acceptance-" + "x" * 40,
        EFFECT_BROKER_MASTER_KEY=base64.b64encode(bytes(range(32))).decode(),
        EFFECT_BROKER_STATIC_ROOT=str(static_root),
        EFFECT_BROKER_API_DOCS="public",
        ALLOWED_HOSTS="127.0.0.1",
        # Plain HTTP on a loopback socket: TLS would be a proxy's job in front.
        EFFECT_BROKER_SSL_REDIRECT="0",
        PYTHONUNBUFFERED="1",
    )
    collected = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert collected.returncode == 0, collected.stderr
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "config.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/static/{ASSETS[0]}", timeout=2)
                break
            except httpx.TransportError:
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    pytest.fail(f"uvicorn did not start:\n{server.communicate()[0]}")
                time.sleep(0.2)
        yield base, static_root
    finally:
        server.terminate()
        try:
            server.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


@pytest.mark.parametrize("asset", ASSETS)
def test_collected_static_file_is_served_by_the_asgi_process(
    production: tuple[str, Path], asset: str
) -> None:
    base, static_root = production
    response = httpx.get(f"{base}/static/{asset}", timeout=5)
    assert response.status_code == 200
    assert response.content == (static_root / asset).read_bytes()
    assert "max-age" in response.headers["cache-control"]


def test_admin_login_page_links_the_served_css(production: tuple[str, Path]) -> None:
    base, _ = production
    page = httpx.get(f"{base}/admin/login/", timeout=5)
    assert page.status_code == 200
    assert '/static/admin/css/base.css"' in page.text


def test_docs_name_only_local_swagger_assets(production: tuple[str, Path]) -> None:
    base, _ = production
    page = httpx.get(f"{base}/docs", timeout=5)
    assert page.status_code == 200
    assert "/static/ninja/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower()
    assert "https://" not in page.text


def test_swagger_bundle_goes_out_compressed(production: tuple[str, Path]) -> None:
    base, static_root = production
    asset = "ninja/swagger-ui-bundle.js"
    response = httpx.get(
        f"{base}/static/{asset}", headers={"Accept-Encoding": "gzip"}, timeout=5
    )
    assert response.headers["content-encoding"] == "gzip"
    wire = int(response.headers["content-length"])
    assert wire == (static_root / f"{asset}.gz").stat().st_size
    assert wire < (static_root / asset).stat().st_size // 2
    assert response.content == (static_root / asset).read_bytes()
