"""Browser tests of the review desk: a stack of their own WITH the Temporal Web UI, and a
headless Chromium driven by Playwright.

Run with `make test-ui` (sets INBOXCRM_UI_TESTS=1 and installs the `ui` extra). Without that
variable the tests in this folder are skipped, so the default `pytest` / `make test` run never
needs Playwright or a browser. The browser is Debian's `chromium` package
(`apt-get install chromium`); Playwright never downloads one (`INBOXCRM_CHROMIUM` overrides
the path).

This stack is separate from the suite's headless `stack` fixture: its own data dir
(`.data/ui-stack`), free ports, its own task queue and its own fresh database, so it can run
next to the main suite without either seeing the other's workflows.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from inboxcrm.stack import postgres
from tests.helpers.stack import ROOT, TEST_GLOBEX_WEBHOOK_SECRET, TEST_WEBHOOK_SECRET
from tests.helpers.ui import ARTIFACTS, UI_TIMEOUT_MS

if TYPE_CHECKING:
    from playwright.async_api import BrowserContext, Page

    from inboxcrm.stack.stack import Stack
    from inboxcrm.verify.probe import StackClient

UI_TESTS_ENABLED = bool(os.environ.get("INBOXCRM_UI_TESTS"))
SKIP_REASON = "browser test of the Temporal UI: run `make test-ui` (INBOXCRM_UI_TESTS=1)"
CHROMIUM = os.environ.get("INBOXCRM_CHROMIUM", "/usr/bin/chromium")
# Debian's chromium, headless, with nothing that phones home (no network here anyway).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if UI_TESTS_ENABLED:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if here in item.path.parents:
            item.add_marker(skip)


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


# --- the stack with the Web UI on ------------------------------------------------------
@pytest.fixture(scope="session")
async def ui_database_url(postgres_server_url: str) -> AsyncIterator[str]:
    """A fresh database for the UI stack only (its relay's sweeper must not see, and start,
    events that belong to the main suite's stack, nor the other way round)."""
    url = await postgres.create_database(postgres_server_url, "inboxcrm_ui")
    yield url
    await postgres.drop_database(postgres_server_url, url)


@pytest.fixture(scope="session")
def ui_stack(ui_database_url: str) -> Iterator[Stack]:
    from inboxcrm.stack.stack import Stack, isolated_config

    # Always our own dev server: it serves the Web UI, with our codec endpoint.
    config = isolated_config(ROOT / ".data" / "ui-stack", ui_database_url,
                             queue_prefix="inboxcrm-ui", ui=True,
                             extra_env={"INBOXCRM_WEBHOOK_SECRET": TEST_WEBHOOK_SECRET,
                                        "INBOXCRM_WEBHOOK_SECRET_GLOBEX":
                                            TEST_GLOBEX_WEBHOOK_SECRET})
    running = Stack(config)
    try:
        running.start_all()
        assert running.temporal_ui_url, "the UI stack must serve the Temporal Web UI"
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def ui_settings(ui_stack: Stack) -> Any:
    """The settings the UI stack's processes run with (same codec keys, same queue)."""
    return ui_stack.settings()


@pytest.fixture
async def ui_env(ui_stack: Stack, ui_settings: Any) -> AsyncIterator[StackClient]:
    from inboxcrm.store import db as inboxcrm_db
    from inboxcrm.verify.probe import Endpoints, StackClient

    pool = await inboxcrm_db.create_pool(ui_stack.database_url, max_size=3)
    client = StackClient(Endpoints(ui_stack.relay_url, ui_stack.sandbox_url,
                                   ui_stack.temporal_address,
                                   ui_stack.env["INBOXCRM_WEBHOOK_SECRET"],
                                   {"globex": ui_stack.env["INBOXCRM_WEBHOOK_SECRET_GLOBEX"]}),
                           pool, ui_settings)
    await client.reset_faults()
    try:
        yield client
    finally:
        await client.reset_faults()
        await client.aclose()
        await pool.close()


# --- the browser -----------------------------------------------------------------------
@pytest.fixture(scope="session")
async def browser_context() -> AsyncIterator[BrowserContext]:
    from playwright.async_api import async_playwright, expect

    expect.set_options(timeout=UI_TIMEOUT_MS)

    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} not found: `apt-get install -y chromium` (or set "
                    "INBOXCRM_CHROMIUM); Playwright's own browser download is not used")
    with tempfile.TemporaryDirectory(prefix="inboxcrm-ui-chromium-") as profile:
        async with async_playwright() as playwright:
            context = await playwright.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
            context.set_default_timeout(UI_TIMEOUT_MS)
            try:
                yield context
            finally:
                await context.close()


@pytest.fixture
async def page(browser_context: BrowserContext, request: pytest.FixtureRequest
               ) -> AsyncIterator[Page]:
    """A fresh tab; on failure its screenshot and HTML are kept in test-artifacts/ui/."""
    tab = await browser_context.new_page()
    try:
        yield tab
    finally:
        if request.node.stash.get(FAILED, False):
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            stem = ARTIFACTS / f"{request.node.name}-FAILED"
            try:
                await tab.screenshot(path=f"{stem}.png", full_page=True)
                html = await tab.content()
                await asyncio.to_thread(Path(f"{stem}.html").write_text, html)
            except Exception as exc:  # noqa: BLE001 - best effort, never hide the failure
                print(f"could not save the failure screenshot: {exc}")
        await tab.close()
