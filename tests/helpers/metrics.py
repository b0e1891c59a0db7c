"""Reading Prometheus text from the stack's metrics listeners in tests."""

from __future__ import annotations

import re
from collections.abc import Callable

from inboxcrm.verify.probe import StackClient


def sample(text: str, name: str, labels: str = "") -> float | None:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else None


async def scrape(env: StackClient, url: str) -> str:
    response = await env.http.get(url)
    assert response.status_code == 200
    return response.text


async def scrape_until(env: StackClient, url: str, holds: Callable[[str], bool]) -> str:
    """The store gauges are refreshed on an interval (1 s in the test stack), not per
    scrape: wait for the refresh that shows what the test just did."""
    async def probe() -> str | None:
        text = await scrape(env, url)
        return text if holds(text) else None

    return str(await env.wait_for(probe, timeout=15, what="store gauges refreshed"))
