"""Phase 2: parked work. Deliver P messages without a From header (extraction routes them
to review: they wait in `awaiting_review`, each a running workflow held in the worker's
cache), then measure the worker's and the Temporal server's RSS (psutil, the process plus
its children) and the wall time of `inboxcrm queue --json` listing them.

The parked items are left as they are: the bench stack is torn down afterwards.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    Handles,
    Options,
    Stalled,
    mb,
    post_all,
    rss_bytes,
    sign,
    without_sender,
)

COUNT_REVIEW = """
SELECT count(*) FROM inbound_events
WHERE tenant = 'acme' AND delivery_id LIKE $1 AND state = 'awaiting_review'
"""
QUEUE_RUNS = 3


def rss_all(h: Handles) -> dict[str, float]:
    # Not PostgreSQL: summing its backends' RSS counts the shared buffers once per backend.
    return {name: mb(rss_bytes(pid)) for name, pid in h.pids.items()
            if name not in ("bench", "postgres")}


def inboxcrm_cli() -> list[str]:
    script = Path(sys.executable).parent / "inboxcrm"
    if script.exists():
        return [str(script)]
    found = shutil.which("inboxcrm")
    return [found] if found else [sys.executable, "-c",
                                  "from inboxcrm.cli import main; main()"]


def time_queue(h: Handles) -> dict[str, Any]:
    argv = inboxcrm_cli() + ["queue", "--json"]
    walls: list[float] = []
    listed = -1
    for _ in range(QUEUE_RUNS):
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=h.cli_env, cwd=ROOT, capture_output=True, text=True,
                              timeout=300, check=False)
        walls.append(time.perf_counter() - t0)
        if done.returncode != 0:
            return {"error": f"exit {done.returncode}: {done.stderr[-400:]}"}
        listed = len(json.loads(done.stdout))
    walls.sort()
    return {"listed": listed, "runs": QUEUE_RUNS, "wall_seconds_min": round(walls[0], 3),
            "wall_seconds_median": round(walls[len(walls) // 2], 3),
            "wall_seconds_max": round(walls[-1], 3)}


async def run_phase(h: Handles, opts: Options, log: Any) -> dict[str, Any]:
    before = rss_all(h)
    prefix = f"pk-{h.run_id}-"
    requests = [sign(h.secret, f"{prefix}{i:05d}",
                     without_sender(f"Question {i}", f"Hello, question number {i}.\n"))
                for i in range(opts.parked)]
    log(f"parked: delivering {opts.parked} messages without a sender")
    started = time.perf_counter()
    try:
        posted = await post_all(h.http, f"{h.relay_url}/v1/inbound/standard", requests,
                                opts.post_concurrency, 600)
    except (Stalled, TimeoutError) as exc:
        log(f"parked: {exc}; restarting the relay")
        h.restart_relay()
        return {"error": f"posting to the relay: {exc}", "rss_mb_before": before}
    waiting = 0
    deadline = time.perf_counter() + 120 + opts.parked * 0.5
    while time.perf_counter() < deadline:
        waiting = int(await h.db.fetchval(COUNT_REVIEW, prefix + "%"))
        if waiting >= opts.parked:
            break
        await asyncio.sleep(0.5)
    parked_seconds = time.perf_counter() - started
    await asyncio.sleep(3)  # let the worker settle (GC, cache) before reading RSS
    after = rss_all(h)
    log(f"parked: {waiting} waiting; RSS MB before {before}, after {after}")
    queue = await asyncio.to_thread(time_queue, h)
    log(f"parked: inboxcrm queue --json {queue}")
    return {
        "parked_requested": opts.parked,
        "parked_waiting": waiting,
        "answers": dict(posted.answers),
        "seconds_to_park_all": round(parked_seconds, 2),
        "rss_mb_before": before,
        "rss_mb_parked": after,
        "worker_rss_mb": after.get("worker"),
        "temporal_rss_mb": after.get("temporal"),
        "target_worker_rss_mb": 300,
        "queue_cli": queue,
    }
