"""The work budget of one message (docs/architecture.md §7): figures, not pass/fail.

    python -m bench.extraction_budget [--rounds 2] [--processes 1]

No stack needed (a few seconds of CPU; `make bench` runs it as its `budget` phase). Three
measurements, each on a uvloop event loop like the worker's, through a `WorkPool` built
from the same settings the worker uses (`INBOXCRM_WORK_*`):

1. **pathological corpus** (tests/fixtures/pathological): per message, the wall time of
   its extraction through the pool and the child's CPU for it; the worst of each. For
   reference, the CPU the same message costs in this process (what a worker's event loop
   was blocked for before the budget).
2. **event-loop lag while it runs**: a 10 ms ticker on the loop that awaits the pool while
   the corpus and ordinary messages are extracted concurrently (the worker's loop awaits
   its pool the same way); max and p99 of how late it woke.
3. **per-item overhead** on ordinary messages (tests/helpers/corpus.py and the real-mail
   corpus, `--rounds` passes): CPU per message in this process vs through the pool
   (parent + child), and the wall time per message one at a time.

Writes bench/results/extraction_budget.json; `run()` returns the same dict for bench.run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import uvloop

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/extraction_budget.py`
    sys.path.insert(0, str(ROOT))

from inboxcrm.domain.extraction import extract_and_route, work_pool  # noqa: E402
from inboxcrm.domain.policy import get_policy  # noqa: E402
from inboxcrm.platform.config import Settings  # noqa: E402
from inboxcrm.platform.workpool import IN_PROCESS, Runner, WorkPool  # noqa: E402
from tests.fixtures.pathological import CASES as PATHOLOGICAL  # noqa: E402
from tests.helpers.corpus import CASES as SYNTHETIC  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "extraction_budget.json"
REALMAIL = ROOT / "tests" / "fast" / "realmail" / "mail"
TENANT = "globex"
CPU_BUDGET_SECONDS = 1.0
TICK = 0.01


def ordinary_messages() -> list[bytes]:
    return [case.raw for case in SYNTHETIC] + [p.read_bytes() for p in sorted(REALMAIL.iterdir())]


def _children_cpu(pool: WorkPool) -> float:
    total = 0.0
    for pid in pool.child_pids():
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class LagMeter:
    """How late a TICK-second sleep wakes on this loop: what a workflow task or a heartbeat
    waiting on the same loop would suffer."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            before = loop.time()
            await asyncio.sleep(TICK)
            self.samples.append(max(0.0, loop.time() - before - TICK))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._task is not None:
            await self._task
        ordered = sorted(self.samples) or [0.0]
        return {"ticks": len(self.samples), "max_ms": round(ordered[-1] * 1000, 1),
                "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 1)}


async def _pathological(pool: WorkPool) -> list[dict[str, Any]]:
    policy = get_policy(TENANT)
    rows = []
    for case in PATHOLOGICAL:
        raw = case.raw
        started = time.process_time()
        local = await extract_and_route(raw, policy)
        in_process = time.process_time() - started
        cpu_before, wall_before = _children_cpu(pool), time.perf_counter()
        pooled = await extract_and_route(raw, policy, runner=pool)
        wall = time.perf_counter() - wall_before
        rows.append({
            "case": case.name, "bytes": len(raw), "route": pooled.route,
            "first_reason": pooled.reasons[0] if pooled.reasons else None,
            "pool_wall_seconds": round(wall, 4),
            "pool_child_cpu_seconds": round(_children_cpu(pool) - cpu_before, 4),
            "in_process_cpu_seconds": round(in_process, 4),
            "same_outcome": pooled == local,
        })
    return rows


async def _lag_while_chewing(runner: Runner, ordinary: list[bytes]) -> dict[str, Any]:
    policy = get_policy(TENANT)
    messages = [case.raw for case in PATHOLOGICAL] + ordinary  # built before the clock
    meter = LagMeter()
    meter.start()
    started = time.perf_counter()
    await asyncio.gather(*(extract_and_route(raw, policy, runner=runner) for raw in messages))
    lag = await meter.stop()
    return {"messages": len(messages),
            "seconds": round(time.perf_counter() - started, 2), **lag}


async def _per_item(pool: WorkPool, ordinary: list[bytes], rounds: int) -> dict[str, Any]:
    policy = get_policy(TENANT)
    messages = ordinary * rounds
    for raw in ordinary[:20]:  # warm both paths
        await extract_and_route(raw, policy)
        await extract_and_route(raw, policy, runner=pool)
    cpu, wall = time.process_time(), time.perf_counter()
    for raw in messages:
        await extract_and_route(raw, policy)
    local_cpu, local_wall = time.process_time() - cpu, time.perf_counter() - wall
    children, cpu, wall = _children_cpu(pool), time.process_time(), time.perf_counter()
    for raw in messages:
        await extract_and_route(raw, policy, runner=pool)
    parent_cpu, pool_wall = time.process_time() - cpu, time.perf_counter() - wall
    child_cpu = _children_cpu(pool) - children
    n = len(messages)

    def ms(seconds: float) -> float:
        return round(1000 * seconds / n, 3)

    return {
        "messages": n,
        "in_process_cpu_ms": ms(local_cpu), "in_process_wall_ms": ms(local_wall),
        "pool_parent_cpu_ms": ms(parent_cpu), "pool_child_cpu_ms": ms(child_cpu),
        "pool_total_cpu_ms": ms(parent_cpu + child_cpu), "pool_wall_ms": ms(pool_wall),
        "overhead_cpu_ms": ms(parent_cpu + child_cpu - local_cpu),
        "overhead_wall_ms": ms(pool_wall - local_wall),
    }


async def _run(rounds: int, processes: int | None) -> dict[str, Any]:
    settings = Settings(env="local")  # only the work budget is read; no stack, no sender
    processes = processes or settings.work_processes
    ordinary = ordinary_messages()
    async with work_pool(settings, processes) as pool:
        rows = await _pathological(pool)
        lag = await _lag_while_chewing(pool, ordinary)
        lag_on_loop = await _lag_while_chewing(IN_PROCESS, ordinary)
        per_item = await _per_item(pool, ordinary, rounds)
        stats = vars(pool.stats).copy()
    worst_wall = max(rows, key=lambda r: r["pool_wall_seconds"])
    worst_cpu = max(rows, key=lambda r: r["pool_child_cpu_seconds"])
    worst_before = max(rows, key=lambda r: r["in_process_cpu_seconds"])
    return {
        "settings": {"work_processes": processes,
                     "work_time_limit_seconds": settings.work_time_limit_seconds,
                     "work_memory_limit_mb": settings.work_memory_limit_mb,
                     "tenant": TENANT},
        "pathological": rows,
        "worst_wall_seconds": worst_wall["pool_wall_seconds"],
        "worst_wall_case": worst_wall["case"],
        "worst_child_cpu_seconds": worst_cpu["pool_child_cpu_seconds"],
        "worst_child_cpu_case": worst_cpu["case"],
        "worst_in_process_cpu_seconds": worst_before["in_process_cpu_seconds"],
        "median_child_cpu_seconds": round(statistics.median(
            r["pool_child_cpu_seconds"] for r in rows), 4),
        "cpu_budget_seconds": CPU_BUDGET_SECONDS,
        "too_complex": sum(r["first_reason"] == "too_complex" for r in rows),
        "never_auto": all(r["route"] != "auto" for r in rows),
        "same_outcome_as_in_process": all(r["same_outcome"] for r in rows),
        "event_loop_lag": lag,
        # the same work on the loop itself (same limits, no pool): how the worker ran before
        "event_loop_lag_in_process": lag_on_loop,
        "per_item": per_item,
        "pool_stats": stats,
    }


def run(rounds: int = 1, processes: int | None = None) -> dict[str, Any]:
    """The whole measurement on a fresh uvloop loop (what bench.run calls)."""
    return uvloop.run(_run(rounds, processes))


def rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, target) rows for the benchmark table."""
    lag, item = result["event_loop_lag"], result["per_item"]
    on_loop = result.get("event_loop_lag_in_process") or {}
    return [
        ("budget: worst extraction over the pathological corpus",
         f"{result['worst_child_cpu_seconds']} s CPU ({result['worst_child_cpu_case']}), "
         f"{result['worst_wall_seconds']} s wall ({result['worst_wall_case']}) through the "
         f"pool; {len(result['pathological'])} messages, {result['too_complex']} too_complex"
         f"; in-process with the same limits: {result['worst_in_process_cpu_seconds']} s "
         f"(23.8 s for the comment flood before them, issue 20)",
         f"<= {result['cpu_budget_seconds']} s"),
        ("budget: event-loop lag while the pool chews it",
         f"max {lag['max_ms']} ms, p99 {lag['p99_ms']} ms over {lag['ticks']} ticks "
         f"({lag['messages']} messages in {lag['seconds']} s); the same work on the loop "
         f"itself: max {on_loop.get('max_ms')} ms", ""),
        ("budget: per-item cost, ordinary mail",
         f"in-process {item['in_process_cpu_ms']} ms CPU; through the pool "
         f"{item['pool_total_cpu_ms']} ms CPU ({item['pool_parent_cpu_ms']} parent + "
         f"{item['pool_child_cpu_ms']} child), {item['pool_wall_ms']} ms wall vs "
         f"{item['in_process_wall_ms']}: overhead {item['overhead_cpu_ms']} ms CPU / "
         f"{item['overhead_wall_ms']} ms wall per message ({item['messages']} messages)", ""),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.extraction_budget",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2,
                        help="passes over the ordinary messages for the per-item figures")
    parser.add_argument("--processes", type=int,
                        help="pool processes (default INBOXCRM_WORK_PROCESSES)")
    args = parser.parse_args(argv)
    result = run(max(1, args.rounds), args.processes)
    for name, value, target in rows(result):
        print(f"{name}: {value}" + (f" (target {target})" if target else ""))
    print()
    for row in result["pathological"]:
        print(f"  {row['case']:<24} {row['bytes']:>9} B  pool {row['pool_wall_seconds']:>7} s "
              f"wall {row['pool_child_cpu_seconds']:>7} s CPU  in-process "
              f"{row['in_process_cpu_seconds']:>7} s  {row['route']} {row['first_reason']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"finished_at": time.time(), **result}, indent=2) + "\n")
    print(f"\nwritten: {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
