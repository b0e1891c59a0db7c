"""The review card's work on a message runs only for someone who may see the item, and waits
for it without holding a database connection (issue 36: twenty parallel views of a costly
card drained the relay's pool). The desk's router in process, on the stack's real database
and items, with the relay's work runner counted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar
from urllib.parse import quote

import asyncpg
import httpx
from fastapi import FastAPI

from inboxcrm.ingress.deps import get_ingestor, get_work
from inboxcrm.ingress.review import ReviewDesk
from inboxcrm.platform.config import Settings
from inboxcrm.platform.workpool import IN_PROCESS
from inboxcrm.stack.stack import Stack
from inboxcrm.store.db import create_pool
from inboxcrm.verify.probe import StackClient
from tests.helpers.messages import no_sender_message
from tests.test_reviewers import add_reviewer

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class CountingRunner:
    """The in-process runner, noting each piece of work and the pool's free connections
    while it runs."""

    pool: asyncpg.Pool
    tenants: list[str]
    idle_while_working: list[int]

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.idle_while_working.append(self.pool.get_idle_size())
        return await IN_PROCESS.run(fn, *args, **kwargs)

    def for_tenant(self, tenant: str) -> CountingRunner:
        self.tenants.append(tenant)
        return self


@dataclass
class LedgerPool:
    """What the desk's routes use of the relay's ledger: its connection pool."""

    pool: asyncpg.Pool


async def test_the_card_is_worked_on_only_for_its_tenant_and_holds_no_connection(
        env: StackClient, stack: Stack) -> None:
    acme_token = add_reviewer(stack, "card-acme", "acme")
    globex_token = add_reviewer(stack, "card-globex", "globex")
    item = await env.deliver(no_sender_message())
    await env.wait_state(item, "awaiting_review")

    pool = await create_pool(stack.env["DATABASE_URL"], min_size=1, max_size=1)
    try:
        runner = CountingRunner(pool, [], [])
        app = FastAPI()
        app.include_router(ReviewDesk(Settings(env="local")).router())
        app.dependency_overrides[get_ingestor] = lambda: LedgerPool(pool)
        app.dependency_overrides[get_work] = lambda: runner
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://desk") as http:
            path = f"/review/{quote(item, safe='')}"

            def ask(token: str) -> Any:
                return http.get(path, headers={"Authorization": f"Bearer {token}"})

            foreign = await ask(globex_token)
            assert foreign.status_code == 404
            assert runner.tenants == []  # nothing was read of the message for globex
            own = await ask(acme_token)
            assert own.status_code == 200, own.text
    finally:
        await pool.close()
    assert runner.tenants == ["acme"]
    # The pool's one connection was back in it while the message was worked on.
    assert runner.idle_while_working == [1]
