"""Session fixtures: real PostgreSQL (embedded unless DATABASE_URL is set).

Each test session gets a fresh database so runs never see each other's rows.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import asyncpg
import pytest

from inboxcrm.platform.config import LOCAL_MAIL_FROM
from inboxcrm.stack import postgres
from inboxcrm.stack.processes import free_port
from tests.helpers.stack import TEST_GLOBEX_WEBHOOK_SECRET, TEST_WEBHOOK_SECRET, worker_data_dir

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings
    from inboxcrm.stack.stack import Stack
    from inboxcrm.verify.probe import StackClient

# Outside INBOXCRM_ENV=local the fallback From must be set (Settings refuses to start without
# it); the tests build production Settings all over, so they run with the demo sender set, as
# a deployment sets its own. tests/fast/test_cli_config.py unsets it to see the refusal.
os.environ.setdefault("INBOXCRM_MAIL_FROM", LOCAL_MAIL_FROM)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a PostgreSQL server's maintenance database."""
    if os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
        return
    data_dir = worker_data_dir("test-pg")
    already_running = postgres.is_running(data_dir)
    url = postgres.start(data_dir, free_port())
    yield url
    if not already_running:
        postgres.stop(data_dir)


@pytest.fixture(scope="session")
async def database_url(postgres_server_url: str) -> AsyncIterator[str]:
    """A fresh, empty database for this test session."""
    url = await postgres.create_database(postgres_server_url, "inboxcrm_test")
    yield url
    await postgres.drop_database(postgres_server_url, url)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """The session's database, migrated, without the stack: for tests that run the steps
    themselves against a sandbox of their own (tests/helpers/sandbox_process.py)."""
    from inboxcrm.store import db as inboxcrm_db
    from inboxcrm.store.migrate import apply_migrations

    await apply_migrations(database_url)
    pool = await inboxcrm_db.create_pool(database_url, max_size=3)
    yield pool
    await pool.close()


# --- the whole stack: real Temporal dev server, sandbox, worker and relay processes -----


@pytest.fixture(scope="session")
def stack(database_url: str) -> Iterator[Stack]:
    from inboxcrm.stack.stack import Stack, isolated_config

    config = isolated_config(
        worker_data_dir("test-stack"), database_url, queue_prefix="inboxcrm-test",
        temporal_address=os.environ.get("TEMPORAL_ADDRESS") or None,
        extra_env={"INBOXCRM_WEBHOOK_SECRET": TEST_WEBHOOK_SECRET,
                   "INBOXCRM_WEBHOOK_SECRET_GLOBEX": TEST_GLOBEX_WEBHOOK_SECRET},
    )
    running = Stack(config)
    # What this test process reads in-process of the stack's rows (a review card, an export,
    # a step run here) it opens with the stack's at-rest keys, as the stack's own processes do
    # (inboxcrm/platform/atrest.py; the process's own settings name no key file).
    keys = pytest.MonkeyPatch()
    try:
        running.start_all()
        from inboxcrm.platform import atrest

        sealer = atrest.sealer_for(running.settings())
        keys.setattr(atrest, "process_sealer", lambda: sealer)
        yield running
    finally:
        keys.undo()
        running.stop()


@pytest.fixture
async def db(database_url: str, stack: Stack) -> AsyncIterator[asyncpg.Pool]:
    from inboxcrm.store import db as inboxcrm_db

    pool = await inboxcrm_db.create_pool(database_url, max_size=5)
    yield pool
    await pool.close()


@pytest.fixture
async def env(stack: Stack, db: asyncpg.Pool, app_settings: Settings
              ) -> AsyncIterator[StackClient]:
    from inboxcrm.verify.probe import Endpoints, StackClient

    client = StackClient(Endpoints(stack.relay_url, stack.sandbox_url, stack.temporal_address,
                                   stack.env["INBOXCRM_WEBHOOK_SECRET"],
                                   {"globex": stack.env["INBOXCRM_WEBHOOK_SECRET_GLOBEX"]}),
                         db, app_settings)
    await client.reset_faults()
    yield client
    await client.reset_faults()
    await client.aclose()


@pytest.fixture(scope="session")
def app_settings(stack: Stack) -> Settings:
    """The settings the stack's own processes run with (same codec keys, same queue)."""
    return stack.settings()
