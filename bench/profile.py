"""The profiled product run: where one item's CPU goes, and what it costs in counts.

After the measured rounds the benchmark runs the product once more (not counted in the
throughput figures) with instruments attached, so that the measured rounds stay unperturbed:

- a sampling profile (py-spy, `--nonblocking`: the target is never paused; `--gil`: only
  the thread holding the GIL, i.e. Python's CPU, not its idle event loop) of every worker
  process and of the relay, written as collapsed stacks (`bench/results/profile-<process>.txt`,
  readable by speedscope and flamegraph.pl), a flame graph
  (`bench/results/profile-<process>.svg`) and top-N tables in the JSON;
- PostgreSQL statements and round trips per item (`pg_stat_statements`, preloaded into the
  bench's own PostgreSQL, tracking switched on only for this run), split into the product's
  database and the sandbox's (the destination stand-in runs on a database of its own);
- history events by type per item, from the histories of every workflow of the run, and
  their size;
- bytes through the workers' payload codec per item (`inboxcrm_codec_bytes` on the workers'
  metrics endpoints).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench.common import ROOT

RESULTS = ROOT / "bench" / "results"
SAMPLE_RATE = 100  # Hz: 10 ms per sample, about the cost of an item's workflow task
TOP = 25


def py_spy() -> str | None:
    """The pinned py-spy of the bench extra (`pip install -e '.[bench]'`)."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


# --- PostgreSQL: pg_stat_statements --------------------------------------------------------
def prepare_postgres(pg_dir: Path, port: int) -> None:
    """Initialise the bench's PostgreSQL with pg_stat_statements preloaded (tracking off until
    the profiled run), before the stack starts it again (on the same port: no other port is
    taken from the pool the stack drew its ports from)."""
    from inboxcrm.stack import postgres

    url = postgres.start(pg_dir, port)

    async def configure() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("ALTER SYSTEM SET shared_preload_libraries = "
                               "'pg_stat_statements'")
            await conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'none'")
            await conn.execute("ALTER SYSTEM SET pg_stat_statements.track_utility = on")
        finally:
            await conn.close()

    try:
        asyncio.run(configure())
    finally:
        postgres.stop(pg_dir)


async def enable_statements(db: asyncpg.Pool) -> bool:
    try:
        await db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await db.fetchval("SELECT count(*) FROM pg_stat_statements")
        return True
    except asyncpg.PostgresError:
        return False


def statement_servers(h: Any) -> list[asyncpg.Pool]:
    """The servers whose statements the profiled run reads: the product's and, when it has
    a server of its own, the sandbox's."""
    return [db for db in ((h.db if h.statements else None), h.sandbox_db) if db is not None]


async def track_statements(db: asyncpg.Pool, on: bool) -> None:
    await db.execute(f"ALTER SYSTEM SET pg_stat_statements.track = '{'top' if on else 'none'}'")
    await db.execute("SELECT pg_reload_conf()")
    await asyncio.sleep(0.5)  # every backend re-reads its configuration between commands
    if on:
        await db.execute("SELECT pg_stat_statements_reset()")


TRANSACTION_CONTROL = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|START TRANSACTION|SAVEPOINT|"
                                 r"RELEASE|SET|SHOW|RESET|DISCARD|DEALLOCATE|LISTEN|UNLISTEN)\b",
                                 re.IGNORECASE)


async def read_statements(db: asyncpg.Pool, items: int, exclude: set[str]) -> dict[str, Any]:
    """Statements and round trips per item, by database. A call is one round trip (asyncpg
    sends parse/bind/execute/sync in one flight; BEGIN and COMMIT are calls of their own).
    `exclude`: the benchmark's own queries (its progress polling)."""
    rows = await db.fetch("""
        SELECT d.datname, s.query, s.calls, s.total_exec_time, s.rows
        FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid""")
    excluded = {" ".join(q.split()) for q in exclude}
    out: dict[str, Any] = {}
    for row in rows:
        query = " ".join(row["query"].split())
        if query in excluded or "pg_stat_statements" in query or "pg_reload_conf" in query:
            continue
        side = "product" if row["datname"] == "postgres" else (
            "sandbox" if row["datname"] == SANDBOX_DB else row["datname"])
        entry = out.setdefault(side, {"round_trips": 0, "statements": 0,
                                      "transaction_control": 0, "exec_ms": 0.0, "top": []})
        calls = int(row["calls"])
        entry["round_trips"] += calls
        entry["exec_ms"] += float(row["total_exec_time"])
        if TRANSACTION_CONTROL.match(query):
            entry["transaction_control"] += calls
        else:
            entry["statements"] += calls
        entry["top"].append((calls, float(row["total_exec_time"]), query))
    for entry in out.values():
        entry["top"] = [{"per_item": round(c / items, 2), "exec_ms_per_item": round(t / items, 3),
                         "query": q[:160]}
                        for c, t, q in sorted(entry["top"], key=lambda r: -r[0])[:TOP_STATEMENTS]
                        if c / items >= 0.05]
        for key in ("round_trips", "statements", "transaction_control"):
            entry[f"{key}_per_item"] = round(entry.pop(key) / items, 2)
        entry["exec_ms_per_item"] = round(entry.pop("exec_ms") / items, 3)
    return out


SANDBOX_DB = "bench_sandbox"
# Every statement an item runs at least once in twenty, up to this many, by calls.
TOP_STATEMENTS = 40


async def sandbox_database(server_url: str) -> str:
    """A database of its own for the sandbox (the destination stand-in), so that its
    statements and round trips are told apart from the product's."""
    conn = await asyncpg.connect(server_url)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", SANDBOX_DB):
            await conn.execute(f'CREATE DATABASE "{SANDBOX_DB}"')
    finally:
        await conn.close()
    return server_url.rsplit("/", 1)[0] + f"/{SANDBOX_DB}"


# --- storage and destination calls ---------------------------------------------------------
STORAGE = """
SELECT (SELECT sum(pg_total_relation_size(c.oid))::float8 FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'm')) AS table_bytes,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 AS wal_bytes,
       (SELECT sum(n_tup_upd)::float8 FROM pg_stat_user_tables
        WHERE schemaname = 'public') AS row_updates,
       (SELECT sum(n_tup_hot_upd)::float8 FROM pg_stat_user_tables
        WHERE schemaname = 'public') AS hot_updates
"""


async def storage(db: asyncpg.Pool) -> dict[str, float]:
    """The product database's tables (with indexes and TOAST), the server's WAL position (the
    sandbox has a server of its own), and row updates, of which HOT (heap-only: no index
    entry written, the page had room)."""
    await asyncio.sleep(1.5)  # every backend flushes its statistics at least once a second
    row = await db.fetchrow(STORAGE)
    assert row is not None
    return {"table_bytes": float(row["table_bytes"] or 0), "wal_bytes": float(row["wal_bytes"]),
            "row_updates": float(row["row_updates"] or 0),
            "hot_updates": float(row["hot_updates"] or 0)}


async def destination_calls(sandbox_url: str) -> Counter[str]:
    """Calls the sandbox (the CRM and mail stand-in) received, by target (`crm.upsert`,
    `mail.send`, ...): the provider calls an item costs."""
    async with httpx.AsyncClient(timeout=30) as http:
        try:
            calls = (await http.get(f"{sandbox_url}/_sandbox/calls")).json()
        except (httpx.HTTPError, ValueError):
            return Counter()
    return Counter(str(call.get("target")) for call in calls.get("calls", []))


# --- codec bytes ---------------------------------------------------------------------------
async def codec_bytes(urls: list[str]) -> dict[str, float]:
    """`inboxcrm_codec_bytes` by direction, summed over the workers' metrics endpoints."""
    totals: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=10) as http:
        for url in urls:
            try:
                text = (await http.get(url)).text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                if not line.startswith("inboxcrm_codec_bytes"):
                    continue
                match = re.search(r'direction="(\w+)"', line)
                if match:
                    direction = match.group(1)
                    totals[direction] = totals.get(direction, 0.0) + float(line.split()[-1])
    return totals


# --- histories -----------------------------------------------------------------------------
async def history_counts(client: Client, workflows: list[tuple[str, str]],
                         concurrency: int = 8) -> dict[str, Any]:
    """History events by type per item, over every workflow of the run (workflow ID, final
    state / reason). Also the history's size in bytes (the events as stored)."""
    by_outcome: dict[str, dict[str, Any]] = {}
    overall: Counter[str] = Counter()
    total_bytes = 0
    queue = list(workflows)

    async def one(workflow_id: str, outcome: str) -> None:
        nonlocal total_bytes
        kinds: Counter[str] = Counter()
        size = 0
        async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
            name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
            if name == "MARKER_RECORDED":
                name += ":" + event.marker_recorded_event_attributes.marker_name
            elif name == "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES":
                # The SDK's own upsert for a new patch (not a billed action in Temporal Cloud).
                fields = event.upsert_workflow_search_attributes_event_attributes \
                    .search_attributes.indexed_fields
                if set(fields) == {"TemporalChangeVersion"}:
                    name += ":TemporalChangeVersion"
            kinds[name] += 1
            size += event.ByteSize()
        bucket = by_outcome.setdefault(outcome, {"items": 0, "events": Counter(), "bytes": 0})
        bucket["items"] += 1
        bucket["events"].update(kinds)
        bucket["bytes"] += size
        overall.update(kinds)
        total_bytes += size

    async def lane() -> None:
        while queue:
            workflow_id, outcome = queue.pop()
            with contextlib.suppress(Exception):
                await one(workflow_id, outcome)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    items = sum(b["items"] for b in by_outcome.values())
    if not items:
        return {"items": 0}

    def per(counter: Counter[str], n: int) -> dict[str, float]:
        return {k: round(v / n, 2) for k, v in sorted(counter.items())}

    return {
        "items": items,
        "events_per_item": round(sum(overall.values()) / items, 2),
        "by_type_per_item": per(overall, items),
        "history_bytes_per_item": round(total_bytes / items),
        "by_outcome": {
            outcome: {"items": b["items"],
                      "events_per_item": round(sum(b["events"].values()) / b["items"], 2),
                      "history_bytes_per_item": round(b["bytes"] / b["items"]),
                      "by_type_per_item": per(b["events"], b["items"])}
            for outcome, b in sorted(by_outcome.items(), key=lambda kv: -kv[1]["items"])},
    }


# --- sampling profiles ---------------------------------------------------------------------
class Profiler:
    """py-spy record on each target process, for the duration of the profiled run."""

    def __init__(self, targets: dict[str, int], out_dir: Path = RESULTS) -> None:
        self.targets = targets
        self.out_dir = out_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started = 0.0
        self.elapsed = 0.0
        self.own_cpu: dict[str, float] = {}
        self.errors: dict[str, str] = {}

    def path(self, name: str) -> Path:
        return self.out_dir / f"profile-{name}.txt"

    def start(self) -> bool:
        binary = py_spy()
        if binary is None:
            self.errors["py-spy"] = "not installed (pip install -e '.[bench]')"
            return False
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in self.targets.items():
            self.procs[name] = subprocess.Popen(
                [binary, "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE),
                 "--nonblocking", "--gil", "--format", "raw", "--output", str(self.path(name))],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.started = time.perf_counter()
        return True

    def stop(self) -> None:
        self.elapsed = time.perf_counter() - self.started
        for name, proc in self.procs.items():
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(proc.pid).cpu_times()
                self.own_cpu[name] = round(t.user + t.system, 2)
            proc.send_signal(signal.SIGINT)
        for name, proc in self.procs.items():
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if not self.path(name).exists():
                self.errors[name] = (err or b"").decode(errors="replace").strip()[-300:]

    def summaries(self, items: int, cpu: dict[str, float]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.procs:
            path = self.path(name)
            if not path.exists():
                out[name] = {"error": self.errors.get(name, "no profile written")}
                continue
            stacks = read_collapsed(path)
            summary = summarise(stacks, items, SAMPLE_RATE)
            summary["cpu_seconds_psutil"] = cpu.get(name)
            summary["py_spy_cpu_seconds"] = self.own_cpu.get(name)
            summary["collapsed"] = str(path.relative_to(ROOT))
            svg = path.with_suffix(".svg")
            write_flamegraph(stacks, svg, f"inboxcrm bench: {name}, {items} items, "
                             f"{SAMPLE_RATE} Hz")
            summary["flamegraph"] = str(svg.relative_to(ROOT))
            out[name] = summary
        return out


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_SITE = re.compile(r"^.*?/(?:site|dist)-packages/")


def short_file(path: str) -> str:
    path = _SITE.sub("", path)
    root = str(ROOT) + "/"
    if path.startswith(root):
        path = path[len(root):]
    return re.sub(r"^.*?/lib/python3\.\d+/", "stdlib/", path)


def frame_name(frame: str) -> str:
    """`func (path:line)` -> `func (short path)`: lines merged, paths shortened."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    return f"{match['func']} ({short_file(match['file'])})"


def read_collapsed(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) format: `frame;frame;...;leaf count`, outermost first. The
    first frame of each stack is the thread (`process ...` / `thread ...` with --threads)."""
    stacks = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        stacks.append(([frame_name(f) for f in stack.split(";") if f], int(count)))
    return stacks


def package_of(frame: str) -> str:
    """The package (or the project's room) a frame belongs to."""
    match = re.search(r"\(([^()]*)\)$", frame)
    path = match.group(1) if match else frame
    if path.startswith("stdlib/"):
        return "stdlib:" + path.split("/")[1].removesuffix(".py")
    parts = path.split("/")
    if parts[0] in ("inboxcrm", "temporalio") and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0].removesuffix(".py")


def summarise(stacks: list[tuple[list[str], int]], items: int, rate: int) -> dict[str, Any]:
    """Top-N by self time (leaf frame), by inclusive time (anywhere on the stack, once per
    sample) and self time by package; in ms of sampled CPU per item."""
    total = sum(c for _, c in stacks)
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    for frames, count in stacks:
        if not frames:
            continue
        self_time[frames[-1]] += count
        packages[package_of(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count
    ms = 1000.0 / rate / max(items, 1)

    def table(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"ms_per_item": round(c * ms, 2), "share": round(c / total, 3), "frame": f}
                for f, c in counter.most_common(TOP)]

    return {"samples": total, "sampled_ms_per_item": round(total * ms, 1),
            "self": table(self_time), "inclusive": table(inclusive),
            "self_by_package": table(packages)}


def write_flamegraph(stacks: list[tuple[list[str], int]], path: Path, title: str,
                     width: int = 1600, row: int = 16) -> None:
    """A plain SVG flame graph of collapsed stacks (root at the bottom, widths = samples);
    hover a box for its frame and share. Frames under 0.1 % are left out."""
    tree: dict[str, Any] = {"n": 0, "kids": {}}
    for frames, count in stacks:
        node = tree
        node["n"] += count
        for frame in frames:
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += count
    total = tree["n"] or 1
    boxes: list[tuple[int, float, float, str, int]] = []

    def walk(node: dict[str, Any], depth: int, x: float) -> int:
        deepest = depth
        for frame, kid in sorted(node["kids"].items()):
            w = kid["n"] / total * width
            if kid["n"] / total >= 0.001:
                boxes.append((depth, x, w, frame, kid["n"]))
                deepest = max(deepest, walk(kid, depth + 1, x))
            x += w
        return deepest

    depth = walk(tree, 0, 0.0) + 1
    height = (depth + 2) * row
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           f'<text x="4" y="12">{html.escape(title)}: {total} samples</text>']
    for level, x, w, frame, n in boxes:
        y = height - (level + 1) * row
        hue = 20 + zlib.crc32(package_of(frame).encode()) % 40
        label = html.escape(frame)
        text = label[: int(w / 7)] if w > 21 else ""
        out.append(f'<g><title>{label} ({n} samples, {n / total:.1%})</title>'
                   f'<rect x="{x:.1f}" y="{y}" width="{max(w - 0.5, 0.1):.1f}" '
                   f'height="{row - 1}" fill="hsl({hue},85%,60%)"/>'
                   f'<text x="{x + 2:.1f}" y="{y + row - 4}">{text}</text></g>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
