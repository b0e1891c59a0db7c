"""inboxcrm benchmark (`make bench`): figures, never pass/fail.

Starts ONE fresh stack of its own under .data/bench (embedded PostgreSQL, a file-backed
Temporal dev server with the stack's WAL pragmas, sandbox, worker, relay; free loopback
ports), plus two processes of its own: the engine-floor worker (bench/floor_worker.py) and
the bare ingress endpoint (bench/bare_endpoint.py). Then, on that one server:

  1. throughput  end-to-end emails/s and CPU per email of the product vs the same-work
                 floor (bench/samework.py: the required work, nothing more) and the
                 bare-workflow engine floors, with p50/p95/p99 time from POST to completed;
  2. parked      worker and Temporal RSS with P workflows waiting in review, and the wall
                 time of `inboxcrm queue --json`;
  3. ingress     p50/p99 and requests/s of POST /v1/inbound/standard, new deliveries and
                 duplicates, vs the bare endpoint;
  4. budget      the work budget of one message (bench/extraction_budget.py, no stack, run
                 first): the worst extraction over the pathological corpus, the event-loop
                 lag while a work pool chews it, the pool's cost per ordinary message.

Prints a table; writes bench/results/<timestamp>.json, bench/results/latest.json and
bench/results/latest.png. See bench/README.md.

The noisy-neighbour benchmark is bench/neighbour.py (`make bench-neighbour`).

    python -m bench.run [--quick] [--n 300] [--requests 2000] [--parked 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import fcntl
import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/run.py`
    sys.path.insert(0, str(ROOT))

from bench import ingress, parked, profile, report, throughput  # noqa: E402
from bench.common import (  # noqa: E402
    Handles,
    LaneClients,
    Options,
    cpu_seconds,
    git_revision,
    machine,
    machine_busy_seconds,
    versions,
)

DATA_DIR = ROOT / ".data" / "bench"
PHASES = ("throughput", "parked", "ingress", "budget")
STACK_PHASES = ("throughput", "parked", "ingress")


def log(line: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {line}", flush=True)


def default_workflow_tasks() -> int:
    """The product's default workflow task slots per worker (`Settings`)."""
    from inboxcrm.platform.config import Settings

    return int(Settings.model_fields["max_concurrent_workflow_tasks"].default)


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description="inboxcrm benchmark (figures, not pass/fail)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: n=60, 300 requests, warm-up 30, 100 parked")
    parser.add_argument("--n", type=int, help="distinct emails (and floor workflows) per "
                        "throughput run (default 300, with 20 %% redeliveries: 60)")
    parser.add_argument("--requests", type=int, help="ingress requests per case (default 2000)")
    parser.add_argument("--warmup", type=int, help="ingress warm-up requests (default 100)")
    parser.add_argument("--parked", type=int, help="workflows left in review (default 1000)")
    parser.add_argument("--concurrency", type=int, default=50,
                        help="concurrent ingress clients, and the default for "
                        "--post-concurrency (default 50)")
    parser.add_argument("--post-concurrency", type=int,
                        help="posts (and floor starts) in flight in the throughput and parked "
                        "phases (default: --concurrency)")
    parser.add_argument("--repeat", type=int,
                        help="throughput rounds, which side goes first alternating; the "
                        "ratio uses the medians (default 3, --quick 1)")
    parser.add_argument("--duplicate-ratio", type=float, default=0.20)
    parser.add_argument("--shared-ratio", type=float, default=0.10)
    parser.add_argument("--floor-local-activities", type=int,
                        help="local activities per floor workflow (default 0: the plain floor)")
    parser.add_argument("--floor-activities", type=int,
                        help="regular activities per floor workflow (default 4: the plain "
                        "floor, one per step of extract, plan, CRM, send)")
    parser.add_argument("--same-shape-local-activities", type=int, default=6,
                        help="no-op local activities of the floor in the product's shape "
                        "(default 6: the happy path's five steps and its state record)")
    parser.add_argument("--profile-n", type=int,
                        help="emails in the profiled product run after the measured rounds "
                        "(py-spy, pg_stat_statements, histories, codec bytes; default "
                        "min(n, 300); 0: none)")
    parser.add_argument("--max-concurrent-activities", type=int,
                        default=int(os.environ.get("INBOXCRM_MAX_CONCURRENT_ACTIVITIES", 50)))
    parser.add_argument("--max-concurrent-workflow-tasks", type=int,
                        default=int(os.environ.get("INBOXCRM_MAX_CONCURRENT_WORKFLOW_TASKS",
                                                   default_workflow_tasks())))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="worker processes per side: the product's task queue and the "
                        "floor's get the same number (default: one per core, as a Python "
                        "worker runs on one core)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {','.join(PHASES)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--throughput-timeout", type=float, default=900.0,
                        help="seconds per throughput run before giving up (default 900)")
    args = parser.parse_args(argv)
    phases = tuple(p for p in PHASES if p in {x.strip() for x in args.phases.split(",")})
    unknown = {x.strip() for x in args.phases.split(",")} - set(PHASES)
    if unknown or not phases:
        parser.error(f"--phases: choose from {', '.join(PHASES)}")
    quick = args.quick
    opts = Options(
        n=args.n or (60 if quick else 300),
        requests=args.requests or (300 if quick else 2000),
        warmup=args.warmup if args.warmup is not None else (30 if quick else 100),
        parked=args.parked or (100 if quick else 1000),
        concurrency=args.concurrency, post_concurrency=args.post_concurrency or args.concurrency,
        repeat=max(1, args.repeat or (1 if quick else 3)), workers=max(1, min(args.workers, 8)),
        duplicate_ratio=args.duplicate_ratio, shared_ratio=args.shared_ratio,
        floor_local_activities=args.floor_local_activities,
        floor_activities=args.floor_activities,
        max_concurrent_activities=args.max_concurrent_activities,
        max_concurrent_workflow_tasks=args.max_concurrent_workflow_tasks,
        seed=args.seed, phases=phases, throughput_timeout=args.throughput_timeout,
        quick=quick,
        profile_n=max(0, args.profile_n if args.profile_n is not None
                      else min(args.n or (60 if quick else 300), 300)),
        same_shape_local_activities=max(0, args.same_shape_local_activities),
    )
    for name in ("n", "requests", "parked", "concurrency", "post_concurrency"):
        if not 1 <= getattr(opts, name) <= 100_000:
            parser.error(f"--{name} must be between 1 and 100000")
    return opts


# --- the stack ---------------------------------------------------------------------------
LOGS_KEPT_DIR = ROOT / ".data" / "bench-logs"


def keep_logs(label: str) -> None:
    """The stack's logs of the run that just ended, copied to `.data/bench-logs/<label>/`:
    the next benchmark empties the data dir, and a figure nobody can explain (an error
    answer under load) needs the relay's and the workers' logs of that very run."""
    logs = DATA_DIR / "logs"
    if not logs.is_dir():
        return
    target = LOGS_KEPT_DIR / label
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(logs, target)


@contextlib.contextmanager
def exclusive_data_dir(label: str = "run") -> Any:
    """One bench run at a time per checkout; the data dir is emptied for a fresh stack, and
    its logs are kept under `.data/bench-logs/<label>/` when the run ends."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(DATA_DIR / ".lock", "w")  # noqa: SIM115 - held for the run
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(f"another benchmark run holds {DATA_DIR}/.lock; wait for it to finish")
    try:
        from inboxcrm.stack import postgres

        for pg_dir in (DATA_DIR / "pg", DATA_DIR / "sandbox-pg"):
            if postgres.is_running(pg_dir):  # left over by a killed run
                postgres.stop(pg_dir)
        for entry in DATA_DIR.iterdir():
            if entry.name == ".lock":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        yield DATA_DIR
    finally:
        try:
            keep_logs(label)
        except OSError as exc:  # the figures matter more than the logs
            log(f"could not keep the stack's logs: {exc}")
        lock.close()


def start_stack(opts: Options) -> Any:
    from inboxcrm.stack.processes import free_port
    from inboxcrm.stack.stack import Stack, StackConfig

    config = StackConfig(
        data_dir=DATA_DIR,
        pg_port=free_port(),
        temporal_port=free_port(),
        temporal_ui_port=None,           # headless: no UI server competing for CPU
        temporal_db_file=True,           # file-backed, WAL + synchronous=normal (as `make up`)
        sandbox_port=free_port(),
        relay_port=free_port(),
        relay_metrics_port=free_port(),  # not 9465: another checkout's stack may hold it
        worker_metrics_port=free_port(),
        database_url=None,               # always a fresh embedded PostgreSQL of its own
        temporal_address=None,           # always a fresh dev server of its own
        task_queue=f"inboxcrm-bench-{uuid.uuid4().hex[:6]}",
        extra_env={
            "INBOXCRM_MAX_CONCURRENT_ACTIVITIES": str(opts.max_concurrent_activities),
            "INBOXCRM_MAX_CONCURRENT_WORKFLOW_TASKS": str(opts.max_concurrent_workflow_tasks),
        },
    )
    return Stack(config)


def postmaster_pid(pg_dir: Path) -> int | None:
    try:
        return int((pg_dir / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, IndexError, ValueError):
        return None


def start_bench_processes(stack: Any, workers: int) -> tuple[str, str, str, str]:
    """The floor worker, the same-work floor (its relay and workers, bench/samework.py) and
    the bare endpoint, with the stack's environment, registered among the stack's processes
    (so that stack.stop() stops them too). Returns (floor task queue, bare endpoint URL,
    same-work task queue, same-work relay URL)."""
    from inboxcrm.stack.processes import ManagedProcess, free_port, http_ok, python

    def start(name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name, argv, dict(stack.env), stack.log_dir).start()
        stack.processes[name] = proc
        return proc

    queue = f"bench-floor-{uuid.uuid4().hex[:6]}"
    for k in range(workers):
        name = "floor-worker" if k == 0 else f"floor-worker-{k + 1}"
        floor = start(name, python("bench.floor_worker") + [
            "--task-queue", queue, "--metrics-address", f"127.0.0.1:{free_port()}"])
        floor.wait_ready(floor.log_has("floor worker running on task queue",
                                       since=floor.log_offset))
    same_queue = f"bench-samework-{uuid.uuid4().hex[:6]}"
    for k in range(workers):
        name = "samework-worker" if k == 0 else f"samework-worker-{k + 1}"
        same = start(name, python("bench.samework") + [
            "worker", "--task-queue", same_queue,
            "--metrics-address", f"127.0.0.1:{free_port()}"])
        same.wait_ready(same.log_has("same-work worker running on task queue",
                                     since=same.log_offset))
    same_port = free_port()
    same_url = f"http://127.0.0.1:{same_port}"
    start("samework-relay", python("bench.samework") + [
        "relay", "--port", str(same_port), "--task-queue", same_queue]).wait_ready(
        http_ok(f"{same_url}/healthz"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    start("bare-endpoint", python("bench.bare_endpoint") + ["--port", str(port)]).wait_ready(
        http_ok(f"{url}/healthz"))
    return queue, url, same_queue, same_url


SANDBOX_PG_DIR = DATA_DIR / "sandbox-pg"


def start_sandbox_postgres(profiled: bool) -> str:
    """A PostgreSQL server of its own for the sandbox (the destination stand-in): its CPU,
    statements and WAL are then the stand-in's, never charged to the product, whose own
    server serves only the product (a deployment runs no sandbox). Returns the server URL."""
    from inboxcrm.stack import postgres
    from inboxcrm.stack.processes import free_port

    port = free_port()
    if profiled:
        profile.prepare_postgres(SANDBOX_PG_DIR, port)
    return postgres.start(SANDBOX_PG_DIR, port)


def move_sandbox(stack: Any, database_url: str) -> None:
    """Restart the sandbox (the destination stand-in) on a database of its own, on a server
    of its own (start_sandbox_postgres)."""
    from inboxcrm.stack.processes import ManagedProcess, http_ok, python

    stack.processes["sandbox"].stop()
    proc = ManagedProcess("sandbox", python("sandbox") + [
        "--port", str(stack.config.sandbox_port), "--database-url", database_url],
        dict(stack.env), stack.log_dir).start()
    stack.processes["sandbox"] = proc
    proc.wait_ready(http_ok(f"{stack.sandbox_url}/healthz"))


async def run_phases(stack: Any, opts: Options, result: dict[str, Any],
                     sandbox_server: str | None) -> None:
    from inboxcrm.store import db as inboxcrm_db

    sandbox_pool = None
    if sandbox_server is not None:
        sandbox_database = await profile.sandbox_database(sandbox_server)
        move_sandbox(stack, sandbox_database)
        sandbox_pool = await inboxcrm_db.create_pool(sandbox_server, max_size=2)
    for k in range(1, opts.workers):  # replicas beyond the stack's own worker
        stack.start_worker(k + 1)
    pool = await inboxcrm_db.create_pool(stack.database_url, max_size=4)
    from bench import samework

    await pool.execute(samework.SCHEMA)  # before its relay and workers start
    floor_queue, bare_url, same_queue, same_url = start_bench_processes(stack, opts.workers)
    http = LaneClients(max(opts.concurrency, opts.post_concurrency))
    pids = {name: proc.pid for name, proc in stack.processes.items()}
    pg_pid = postmaster_pid(DATA_DIR / "pg")
    if pg_pid:
        pids["postgres"] = pg_pid
    sandbox_pg_pid = postmaster_pid(SANDBOX_PG_DIR) if sandbox_server else None
    if sandbox_pg_pid:
        pids["sandbox-postgres"] = sandbox_pg_pid
    pids["bench"] = os.getpid()
    watch = OtherWork([pid for pid in (pg_pid, sandbox_pg_pid) if pid])

    def stop_workers() -> None:
        for name, proc in stack.processes.items():
            if name == "worker" or name.startswith("worker-"):
                proc.stop()

    def restart_relay() -> None:
        """A wedged relay (see Stalled) is replaced so that the next phase can run."""
        stack.processes["relay"].stop()
        pids["relay"] = stack.start_relay().pid
    cli_env = dict(stack.env, INBOXCRM_STACK_ENV=str(DATA_DIR / "no-stack.env"))
    handles = Handles(
        run_id=uuid.uuid4().hex[:6], relay_url=stack.relay_url, bare_url=bare_url,
        temporal_address=stack.temporal_address, secret=stack.env["INBOXCRM_WEBHOOK_SECRET"],
        db=pool, http=http, floor_task_queue=floor_queue, pids=pids, cli_env=cli_env,
        stop_worker=stop_workers, restart_relay=restart_relay,
        sandbox_url=stack.sandbox_url, samework_url=same_url, samework_task_queue=same_queue,
        worker_metrics_urls=[f"http://{stack.worker_metrics_address(k + 1)}/metrics"
                             for k in range(opts.workers)],
        statements=bool(opts.profile_n) and await profile.enable_statements(pool),
        sandbox_db=sandbox_pool if sandbox_pool is not None and bool(opts.profile_n)
        and await profile.enable_statements(sandbox_pool) else None,
    )
    try:
        if "throughput" in opts.phases:
            result["throughput"] = await throughput.run_phase(handles, opts, log)
        if "parked" in opts.phases:
            result["parked"] = await parked.run_phase(handles, opts, log)
        if "ingress" in opts.phases:
            result["ingress"] = await ingress.run_phase(handles, opts, log)
    finally:
        result["machine"]["other_work_share"] = watch.share()
        await http.aclose()
        await pool.close()
        if sandbox_pool is not None:
            await sandbox_pool.close()


class OtherWork:
    """How much of the machine went to processes outside the benchmark while it ran: the
    machine's user and system CPU less the run's own (this process and everything it
    started, PostgreSQL's daemon and its backends), as a share of all cores' time. The load
    average cannot tell: at the end it is the run's own load."""

    def __init__(self, postgres_pids: list[int]) -> None:
        self.pids = [os.getpid(), *postgres_pids]
        self.started = time.monotonic()
        self.machine = machine_busy_seconds()
        self.own = self._own()

    def _own(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def share(self) -> float:
        own = self._own() - self.own
        wall = (time.monotonic() - self.started) * (os.cpu_count() or 1)
        other = machine_busy_seconds() - self.machine - own
        return round(max(other, 0.0) / wall, 3) if wall > 0 else 0.0


def error_notes(result: dict[str, Any]) -> list[str]:
    """A phase that stalled gets one explanatory note (see bench/README.md)."""
    errors: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("error"), str):
                errors.append(value["error"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk({k: result.get(k) for k in PHASES})
    errors += (result.get("ingress") or {}).get("warm_up_errors", [])
    notes = []
    if any("in flight" in e for e in errors):
        notes.append(f"{sum('in flight' in e for e in errors)} stall(s): the relay stopped "
                     "answering with every request in flight (see bench/README.md, 'Relay "
                     "stalls'); the relay was restarted after each")
    return notes


def compile_bytecode() -> None:
    """Write .pyc files for the project's packages, as `pip install` does in the image.

    The worker's sandbox re-imports the workflow module for every workflow run; without
    bytecode (PYTHONDONTWRITEBYTECODE is set on some machines) each run compiles it from
    source, a cost no deployment pays."""
    for package in ("inboxcrm", "workflows", "activities", "schemas", "sandbox", "bench"):
        compileall.compile_dir(ROOT / package, quiet=1)


# The share of the machine that processes outside the run may use before its figures are
# called preliminary.
OTHER_WORK_LIMIT = 0.1
# How much the machine's own speed (`common.speed_probe`) may change between the runs before
# the report says the run cannot measure a change of that size.
SPEED_SPREAD_LIMIT = 0.1


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)

    def terminate(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    result: dict[str, Any] = {
        "label": "quick" if opts.quick else "default",
        "started_at": time.time(),
        "machine": machine(),
        "versions": versions(),
        "git": git_revision(),
        "options": asdict(opts),
        "notes": [],
    }
    compile_bytecode()
    m = result["machine"]
    log(f"machine: {m['nproc']} cores ({m['cpu_model']}), {m['ram_gib']} GiB RAM, "
        f"load {m['loadavg_start']}")
    if "budget" in opts.phases:
        log("budget: the pathological corpus through a work pool (no stack)")
        from bench import extraction_budget

        try:
            result["budget"] = extraction_budget.run(rounds=1)
        except Exception as exc:  # a figure we could not take, not a reason to stop
            result["budget"] = {"error": f"{type(exc).__name__}: {exc}"}
    if any(phase in STACK_PHASES for phase in opts.phases):
        with exclusive_data_dir():
            stack = start_stack(opts)
            try:
                log(f"starting a fresh stack under {DATA_DIR} (logs in {stack.log_dir})")
                t0 = time.perf_counter()
                if opts.profile_n and "throughput" in opts.phases:
                    # pg_stat_statements preloaded
                    profile.prepare_postgres(DATA_DIR / "pg", stack.config.pg_port)
                stack.start_all()
                sandbox_server = (start_sandbox_postgres(bool(opts.profile_n))
                                  if "throughput" in opts.phases else None)
                result["stack_start_seconds"] = round(time.perf_counter() - t0, 1)
                asyncio.run(run_phases(stack, opts, result, sandbox_server))
            except KeyboardInterrupt:
                log("interrupted; stopping the stack")
                return 130
            finally:
                stack.stop()
                from inboxcrm.stack import postgres

                postgres.stop(SANDBOX_PG_DIR)
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["finished_at"] = time.time()
    result["notes"] += error_notes(result)
    other = result["machine"].get("other_work_share")
    if other is not None and other > OTHER_WORK_LIMIT:
        result["notes"].append(f"the machine was busy with other work ({other:.0%} of its CPU "
                               "used outside the run): preliminary figures")
    speed = (result.get("throughput") or {}).get("machine_speed") or {}
    if speed.get("spread") is not None and speed["spread"] > SPEED_SPREAD_LIMIT:
        result["notes"].append(
            f"the machine's own speed changed by {speed['spread']:.0%} between runs (a fixed "
            "loop, `machine_speed`): a ratio across rounds, or a change smaller than that, is "
            "not measured by this run")
    if other is None and m["loadavg_start"][0] > 0.5 * m["nproc"]:
        # No stack phase measured it: the load average at the start is all there is (it
        # also remembers whatever ended in the last minutes).
        result["notes"].append("the machine may have been busy (load average at the start "
                               "above half the cores): preliminary figures")
    table = report.format_table(report.rows(result))
    print()
    print(table)
    path = report.write_json(result)
    chart = report.write_chart(result)
    print(f"\nwritten: {path.relative_to(ROOT)}, bench/results/latest.json, "
          + (str(chart.relative_to(ROOT)) if chart else
             "no chart (matplotlib missing: pip install -e '.[bench]')"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
