"""Fixtures of the dashboard browser tests: a fixture store, a running
`phyfarm-dashboard serve` on a free loopback port, and headless Chromium
(Debian's package) driven by Playwright. A missing browser or Playwright is a
skip with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .fixture_store import NOW, REPO
from .fixture_store import build as build_store

CHROMIUM = os.environ.get("PHYFARM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="session")
def dashboard_bin() -> Path:
    binary = Path(os.environ.get("PHYFARM_DASHBOARD_BIN", REPO / "target/debug/phyfarm-dashboard"))
    if not binary.exists():
        subprocess.run(["cargo", "build", "-p", "dashboards"], cwd=REPO, check=True)
    return binary


@pytest.fixture(scope="session")
def store(phyfarm, tmp_path_factory) -> Path:
    return build_store(phyfarm, tmp_path_factory.mktemp("store"))


class Server:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc = proc
        self.url = url.rstrip("/")

    def __call__(self, path: str) -> str:
        return self.url + path


def start(dashboard_bin: Path, store: Path) -> Server:
    proc = subprocess.Popen(
        [
            str(dashboard_bin),
            "--store",
            str(store),
            "--now",
            NOW,
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip()
    if not line.startswith("http://127.0.0.1:"):
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"phyfarm-dashboard did not start: {line!r}\n{err}")
    return Server(proc, line)


def stop(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def server(dashboard_bin, store) -> Iterator[Server]:
    s = start(dashboard_bin, store)
    yield s
    stop(s)


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip(
            f"no Chromium at {CHROMIUM} (apt-get install chromium, or containers/host-setup.sh)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -r pytest-tests/requirements.txt)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
    pg = ctx.new_page()
    pg.errors = []
    pg.dialogs = []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))

    def on_dialog(d):
        pg.dialogs.append(d.message)
        d.dismiss()

    pg.on("dialog", on_dialog)
    # Only the dashboard on loopback (and files of an export) may be fetched.
    pg.outside = []

    def guard(route):
        url = route.request.url
        if url.startswith(("http://127.0.0.1:", "file://", "data:")):
            route.continue_()
        else:
            pg.outside.append(url)
            route.abort()

    pg.route("**/*", guard)
    yield pg
    ctx.close()
