"""Phase 1: end-to-end throughput of the product versus the engine floor.

Product: N signed emails (+ duplicate re-posts of the same delivery ID, + senders shared
between emails) posted to the relay with bounded concurrency, timed from the first POST
until every item is settled in PostgreSQL (`inbound_events.state`, polled in bulk).
Latency per item: `inbound_events.received_at` → the `state_changed` audit row that
recorded its final state.

Floor: N BenchFloorWorkflow runs started with the Temporal client (same concurrency) on
the floor worker's task queue, timed from the first start until every run is closed
(visibility, polled in bulk). Latency per run: visibility StartTime → CloseTime.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench import profile, samework
from bench.common import (
    PARKED,
    TERMINAL,
    Handles,
    Options,
    Signed,
    Stalled,
    answer_of,
    cpu_delta,
    cpu_snapshot,
    inquiry,
    person_name,
    quiet_machine,
    run_bounded,
    sign,
    speed_probe,
    speed_spread,
    summary_ms,
)
from bench.floor_workflow import WORKFLOW_NAME, FloorInput

POLL = 0.25
SETTLE_STALL = 180.0  # no item settled for this long: stop waiting, report what settled
SETTLED = TERMINAL + PARKED

PRODUCT_PROGRESS = """
SELECT state, count(*) AS n FROM inbound_events
WHERE tenant = $1 AND delivery_id LIKE $2 GROUP BY state
"""

PRODUCT_TIMES = """
SELECT e.state, e.reason, e.workflow_id, extract(epoch FROM e.received_at)::float8 AS received,
       (SELECT extract(epoch FROM min(a.at))::float8 FROM audit_log a
        WHERE a.workflow_id = e.workflow_id AND a.action = 'state_changed'
          AND a.detail->>'state' = e.state) AS settled
FROM inbound_events e WHERE e.tenant = $1 AND e.delivery_id LIKE $2
"""


def plan_product(opts: Options, n: int, prefix: str, seed: int
                 ) -> tuple[list[tuple[str, str]], int, int]:
    """Deterministic posting order: (delivery_id, raw) per post. Returns the posts, the
    number of duplicate posts and of emails sharing another email's sender."""
    rng = random.Random(seed)
    shared_count = round(n * opts.shared_ratio)
    shared = set(rng.sample(range(1, n), min(shared_count, max(n - 1, 0))))
    senders: list[tuple[str, str]] = []
    emails: list[tuple[str, str]] = []
    for i in range(n):
        if i in shared and senders:
            # Another email's sender, same name and company (an exact match, not a review
            # case), recent so that the two are often in flight together.
            email, name = rng.choice(senders[-25:])
        else:
            email, name = f"{prefix}{i}@example.com", person_name(i)
            senders.append((email, name))
        emails.append((f"{prefix}{i:05d}", inquiry(email, name, f"Pricing question {i}")))
    posts = list(emails)
    duplicates = sorted(rng.sample(range(n), round(n * opts.duplicate_ratio)), reverse=True)
    for i in duplicates:
        # Re-posted at once (concurrently with the first) or up to ~2 batches later.
        at = min(i + 1 + rng.randint(0, 2 * opts.post_concurrency), len(posts))
        posts.insert(at, emails[i])
    return posts, len(duplicates), len(shared)


async def run_product(h: Handles, opts: Options, round_no: int, n: int,
                      kind: str = "product") -> dict[str, Any]:
    """round_no -1: the warm-up. kind "samework": the same posts (same plan, same seed) to
    the same-work floor's relay (bench/samework.py), settled in its own table."""
    same = kind == "samework"
    prefix = (f"{'sw' if same else 'tp'}-{h.run_id}-{round_no if round_no >= 0 else 'w'}-")
    posts, duplicates, shared = plan_product(opts, n, prefix, opts.seed + round_no)
    url = f"{h.samework_url if same else h.relay_url}/v1/inbound/standard"

    async def progress() -> list[Any]:
        if same:
            return list(await h.db.fetch(samework.PROGRESS, prefix + "%"))
        return list(await h.db.fetch(PRODUCT_PROGRESS, "acme", prefix + "%"))
    msg_ids = {delivery_id: f"msg_{prefix}{k}" for k, (delivery_id, _) in enumerate(posts)}
    answers: Counter[str] = Counter()
    post_latencies: list[float] = []
    retries = 0

    async def one(i: int, lane: int) -> None:
        nonlocal retries
        delivery_id, raw = posts[i]
        for attempt in range(4):  # a provider redelivers a 503; bounded here
            req: Signed = sign(h.secret, delivery_id, raw, msg_id=msg_ids[delivery_id])
            t0 = time.perf_counter()
            try:
                response = await h.http[lane].post(url, content=req.body,
                                                   headers=req.headers)
                answer = answer_of(response)
            except Exception as exc:  # noqa: BLE001 - counted, retried
                answer = type(exc).__name__
            post_latencies.append(time.perf_counter() - t0)
            if answer in ("accepted", "duplicate") or attempt == 3:
                answers[answer] += 1
                return
            retries += 1
            await asyncio.sleep(0.5)

    cpu_before = cpu_snapshot(h.pids)
    started_wall = time.time()
    started = time.perf_counter()
    deadline = started + opts.throughput_timeout
    try:
        await run_bounded(len(posts), opts.post_concurrency, one, opts.throughput_timeout)
    except (Stalled, TimeoutError) as exc:
        return {"kind": kind, "round": round_no, "emails": n, "posts": len(posts),
                "error": f"posting to the relay: {exc}", "answers": dict(answers),
                "per_second": None, "latency_ms": {"count": 0}}
    posted = time.perf_counter() - started

    states: dict[str, int] = {}
    settled_count, progress_at = -1, time.perf_counter()
    while time.perf_counter() < deadline:
        rows = await progress()
        states = {r["state"]: r["n"] for r in rows}
        if sum(states.values()) >= n and all(s in SETTLED for s in states):
            break
        now_settled = sum(n for s, n in states.items() if s in SETTLED)
        if now_settled != settled_count:
            settled_count, progress_at = now_settled, time.perf_counter()
        elif time.perf_counter() - progress_at > SETTLE_STALL:
            break  # nothing settled for minutes: report what is there
        await asyncio.sleep(POLL)
    observed = time.perf_counter() - started
    cpu = cpu_delta(cpu_before, cpu_snapshot(h.pids))

    rows = (await h.db.fetch(samework.TIMES, prefix + "%") if same
            else await h.db.fetch(PRODUCT_TIMES, "acme", prefix + "%"))
    settled = [r for r in rows if r["state"] in SETTLED and r["settled"] is not None]
    completed = [r["settled"] - r["received"] for r in settled if r["state"] == "completed"]
    last = max((r["settled"] for r in settled), default=started_wall + observed)
    elapsed = last - started_wall
    states = dict(Counter(r["state"] for r in rows))
    # A happy-path item (follow-up sent) shows the full step count; else any completed one.
    sample: str | None
    if same:
        sample = f"samework/{prefix}00000"
    else:
        sample = next((r["workflow_id"] for r in rows if r["reason"] == "followup_sent"),
                      next((r["workflow_id"] for r in rows if r["state"] == "completed"),
                           None))
    return {
        "kind": kind,
        "round": round_no,
        "emails": n,
        "posts": len(posts),
        "duplicate_posts": duplicates,
        "shared_sender_emails": shared,
        "answers": dict(answers),
        "post_retries": retries,
        "posting_seconds": round(posted, 2),
        "post_latency_ms": summary_ms(post_latencies),
        "settled": len(settled),
        "not_settled": n - len(settled),
        "states": states,
        "elapsed_seconds": round(elapsed, 2),
        "per_second": round(len(settled) / elapsed, 2) if elapsed > 0 else 0.0,
        "latency_ms": summary_ms(completed),
        "latency_of": ("completed items: samework.deliveries received_at -> done_at" if same
                       else "completed items: received_at -> state_changed(completed) "
                       "audit row"),
        "sample_workflow_id": sample,
        "cpu_seconds": cpu,
    }


async def run_floor(h: Handles, client: Client, opts: Options, round_no: int, n: int,
                    shape: tuple[int, int], already_closed: int,
                    kind: str = "floor") -> dict[str, Any]:
    """shape: (regular activities, local activities) per workflow; round_no -1: warm-up."""
    tag = f"{round_no if round_no >= 0 else 'w'}{'' if kind == 'floor' else '-' + kind}"
    prefix = f"bench-floor/{h.run_id}/{tag}/"
    queue = h.floor_task_queue
    errors: Counter[str] = Counter()

    async def one(i: int, _lane: int) -> None:
        try:
            await client.start_workflow(
                WORKFLOW_NAME, FloorInput(f"{prefix}{i}", local_activities=shape[1],
                                                activities=shape[0]),
                id=f"{prefix}{i}", task_queue=queue)
        except Exception as exc:  # noqa: BLE001 - counted
            errors[type(exc).__name__] += 1

    cpu_before = cpu_snapshot(h.pids)
    started_wall = time.time()
    started = time.perf_counter()
    deadline = started + opts.throughput_timeout
    await run_bounded(n, opts.post_concurrency, one, opts.throughput_timeout)
    posted = time.perf_counter() - started
    want = already_closed + n - sum(errors.values())
    closed = 0
    while time.perf_counter() < deadline:
        running = (await client.count_workflows(
            f"TaskQueue = '{queue}' AND ExecutionStatus = 'Running'")).count
        closed = (await client.count_workflows(
            f"TaskQueue = '{queue}' AND ExecutionStatus != 'Running'")).count
        if running == 0 and closed >= want:
            break
        await asyncio.sleep(POLL)
    cpu = cpu_delta(cpu_before, cpu_snapshot(h.pids))

    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    last = started_wall
    async for wf in client.list_workflows(f"TaskQueue = '{queue}'", page_size=1000):
        if not wf.id.startswith(prefix):
            continue
        statuses[wf.status.name if wf.status else "UNKNOWN"] += 1
        if wf.close_time is not None:
            latencies.append((wf.close_time - wf.start_time).total_seconds())
            last = max(last, wf.close_time.timestamp())
    elapsed = last - started_wall
    done = statuses.get("COMPLETED", 0)
    return {
        "kind": kind,
        "round": round_no,
        "workflows": n,
        "regular_activities_per_workflow": shape[0],
        "local_activities_per_workflow": shape[1],
        "start_errors": dict(errors),
        "starting_seconds": round(posted, 2),
        "statuses": dict(statuses),
        "closed_total_on_queue": closed,
        "elapsed_seconds": round(elapsed, 2),
        "per_second": round(done / elapsed, 2) if elapsed > 0 else 0.0,
        "latency_ms": summary_ms(latencies),
        "latency_of": "visibility StartTime -> CloseTime",
        "sample_workflow_id": f"{prefix}0",
        "cpu_seconds": cpu,
    }


# Local activities the workflow has always run locally (state mirror, audit rows): the floor
# runs them as local activities too. Every other step is a regular activity in the floor.
BOOKKEEPING = frozenset({"record_item_state", "record_audit", "mark_review_escalated",
                         "resolve_operation", "grant_operation_retry",
                         "apply_review_corrections", "approve_followup_intent"})


async def steps_of(client: Client, workflow_id: str | None) -> dict[str, Any] | None:
    """Regular activities scheduled and local activities (markers) recorded in one run's
    history: what one item actually cost in engine round trips. `local_steps` counts the
    local activities that are product steps (not bookkeeping)."""
    if not workflow_id:
        return None
    counts: dict[str, Any] = {"activities": 0, "local_activities": 0, "local_steps": 0,
                              "history_events": 0}
    kinds: Counter[str] = Counter()
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        counts["history_events"] += 1
        kinds[EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")] += 1
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            counts["activities"] += 1
        elif (event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
              and event.marker_recorded_event_attributes.marker_name == "core_local_activity"):
            counts["local_activities"] += 1  # not patch/version markers
            if _local_activity_type(event) not in BOOKKEEPING:
                counts["local_steps"] += 1
    counts["event_types"] = dict(sorted(kinds.items()))
    return counts


def _local_activity_type(event: Any) -> str | None:
    """The activity type in a local-activity marker (core writes it as plain JSON)."""
    data = event.marker_recorded_event_attributes.details.get("data")
    if data is None or not data.payloads:
        return None
    try:
        value = json.loads(data.payloads[0].data).get("activity_type")
    except ValueError:
        return None
    return value if isinstance(value, str) else None


PLAIN_FLOOR = (4, 0)


async def on_quiet_machine(run: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """One measured run, started once the machine is quiet, with the machine's speed just
    before it (`common.quiet_machine`, `common.speed_probe`; bench/README.md)."""
    waited = await asyncio.to_thread(quiet_machine)
    probe = speed_probe()
    result = await run
    result["speed_probe_ms"], result["quiet_wait_s"] = probe, waited
    return result


async def floor_runs(h: Handles, client: Client, opts: Options, round_no: int,
                     shape: tuple[int, int], own: tuple[int, int] | None, closed: int,
                     runs: list[dict[str, Any]], log: Any) -> int:
    """One round's floor (and floor in the product's shape); returns the closed count."""
    log(f"throughput round {round_no + 1}/{opts.repeat}: floor, {opts.n} workflows")
    floor = await on_quiet_machine(run_floor(h, client, opts, round_no, opts.n, shape, closed))
    closed += opts.n
    floor["steps_per_item"] = await steps_of(client, floor.get("sample_workflow_id"))
    log(f"  floor: {floor['per_second']}/s over {floor['elapsed_seconds']}s")
    runs.append(floor)
    if own is not None:
        log(f"throughput round {round_no + 1}/{opts.repeat}: floor in the product's "
            f"shape ({own[0]} activities + {own[1]} local), {opts.n} workflows")
        same = await on_quiet_machine(run_floor(h, client, opts, round_no, opts.n, own, closed,
                                                "floor-same-shape"))
        closed += opts.n
        same["steps_per_item"] = await steps_of(client, same.get("sample_workflow_id"))
        log(f"  floor in the product's shape: {same['per_second']}/s over "
            f"{same['elapsed_seconds']}s")
        runs.append(same)
    return closed


async def run_phase(h: Handles, opts: Options, log: Any) -> dict[str, Any]:
    client = await Client.connect(h.temporal_address)
    runs: list[dict[str, Any]] = []

    # Warm-up (not counted): a few items through each side; the product's history tells
    # the floor how many steps to mirror unless --floor-activities/--floor-local-activities.
    warm_n = min(10, opts.n)
    log(f"throughput warm-up: {warm_n} product emails, {warm_n} floor workflows")
    warm = await run_product(h, opts, -1, warm_n)
    if warm.get("error"):
        log(f"  warm-up: {warm['error']}; restarting the relay")
        h.restart_relay()
    sampled = await steps_of(client, warm.get("sample_workflow_id"))
    # The plain floor: four no-op regular activities (extract, plan, CRM, send), no local.
    shape = (opts.floor_activities if opts.floor_activities is not None else PLAIN_FLOOR[0],
             opts.floor_local_activities if opts.floor_local_activities is not None
             else PLAIN_FLOOR[1])
    # The product's shape with no-op steps (fixed: the happy path's five steps and its state
    # record, all local, as when issue 25 measured it, so a cut that merges steps shows as a
    # cut): what the real work (DB, HTTP, encryption, search attributes) costs on top of the
    # engine, and the denominator of the CPU ratio.
    own: tuple[int, int] | None = (0, opts.same_shape_local_activities)
    if own == shape:
        own = None
    ran = (f"{sampled['activities']} activities + {sampled['local_activities']} local, "
           f"{sampled['history_events']} history events") if sampled else "unknown"
    log(f"  product item ran {ran}; floor runs {shape[0]} activities + {shape[1]} local"
        + (f"; floor in the product's shape {own[0]} + {own[1]} local" if own else ""))
    if h.samework_url:
        await run_product(h, opts, -1, warm_n, "samework")
    closed = 0
    await run_floor(h, client, opts, -1, warm_n, shape, closed)
    closed += warm_n
    if own is not None:
        await run_floor(h, client, opts, -1, warm_n, own, closed, "floor-same-shape")
        closed += warm_n

    for round_no in range(opts.repeat):
        # The server's history store grows with every run, so whoever runs first in a round
        # has the lighter server: even rounds start with the floor, odd ones with the product.
        sides = ["floor", "samework", "product"] if h.samework_url else ["floor", "product"]
        if round_no % 2:
            sides.reverse()
        for side in sides:
            if side == "floor":
                closed = await floor_runs(h, client, opts, round_no, shape, own, closed, runs,
                                          log)
                continue
            if side == "samework":
                log(f"throughput round {round_no + 1}/{opts.repeat}: same-work floor, "
                    f"{opts.n} emails")
                same = await on_quiet_machine(run_product(h, opts, round_no, opts.n,
                                                          "samework"))
                runs.append(same)
                if same.get("error"):
                    log(f"  same-work floor: {same['error']}")
                    continue
                same["steps_per_item"] = await steps_of(client, same.get("sample_workflow_id"))
                log(f"  same-work floor: {same['per_second']}/s over "
                    f"{same['elapsed_seconds']}s, states {same['states']}, answers "
                    f"{same['answers']}")
                continue
            log(f"throughput round {round_no + 1}/{opts.repeat}: product, {opts.n} emails")
            product = await on_quiet_machine(run_product(h, opts, round_no, opts.n))
            runs.append(product)
            if product.get("error"):
                log(f"  product: {product['error']}; restarting the relay")
                h.restart_relay()
                break
            product["steps_per_item"] = await steps_of(client,
                                                       product.get("sample_workflow_id"))
            log(f"  product: {product['per_second']}/s over {product['elapsed_seconds']}s, "
                f"states {product['states']}, answers {product['answers']}")
        if runs and runs[-1].get("error") and runs[-1]["kind"] == "product":
            break
    profiled = None
    if opts.profile_n and not (runs and runs[-1].get("error")
                               and runs[-1]["kind"] == "product"):
        profiled = await profiled_run(h, client, opts, log)
    floor_rates = sorted(r["per_second"] for r in runs
                         if r["kind"] == "floor" and r.get("per_second") is not None)
    product_rates = sorted(r["per_second"] for r in runs
                           if r["kind"] == "product" and r.get("per_second") is not None)
    same_rates = sorted(r["per_second"] for r in runs
                        if r["kind"] == "floor-same-shape" and r.get("per_second") is not None)
    by_round = _ratio_by_round(runs)
    floor_rate = floor_rates[len(floor_rates) // 2] if floor_rates else None
    same_rate = same_rates[len(same_rates) // 2] if same_rates else None
    product_rate = product_rates[len(product_rates) // 2] if product_rates else None
    return {
        "runs": runs,
        "warm_up_product_steps": sampled,
        "floor_shape": {"activities": shape[0], "local_activities": shape[1],
                        "source": "options" if (opts.floor_activities, opts.floor_local_activities)
                        != (None, None) else "the plain floor: 4 no-op regular activities"},
        "floor_per_second": floor_rate,
        "product_per_second": product_rate,
        "ratio": round(product_rate / floor_rate, 3) if floor_rate and product_rate else None,
        "ratio_by_round": by_round,
        "same_shape_floor": None if own is None else {
            "activities": own[0], "local_activities": own[1], "per_second": same_rate,
            "ratio": round(product_rate / same_rate, 3) if same_rate and product_rate
            else None},
        "target_ratio": 1.0,
        "cpu_per_item": (cpu := cpu_per_item(runs)),
        "same_work_floor": same_work_summary(runs, cpu),
        "machine_speed": speed_spread([r["speed_probe_ms"] for r in runs
                                       if r.get("speed_probe_ms") is not None]),
        "profiled_run": profiled,
    }


def _ratio_by_round(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """product / floor within each round, and who went first: the spread shows how much
    the server's growing history store moves one side against the other."""
    rates: dict[int, dict[str, float]] = {}
    for run in runs:
        if run.get("per_second") is not None and run["kind"] in ("product", "floor"):
            rates.setdefault(run["round"], {})[run["kind"]] = run["per_second"]
    return [{"round": number + 1, "first": "floor" if number % 2 == 0 else "product",
             "ratio": round(pair["product"] / pair["floor"], 3)}
            for number, pair in sorted(rates.items())
            if pair.get("floor") and pair.get("product")]


# The processes that stand in for the destinations (HubSpot, Resend): not the product's.
STAND_IN_ROLES = frozenset({"sandbox", "sandbox-postgres"})


def _group(process: str) -> str:
    """Processes by role: every worker process of any side is `workers`, the same-work
    floor's relay is `relay`."""
    if process.startswith(("worker", "floor-worker", "samework-worker")):
        return "workers"
    if process == "samework-relay":
        return "relay"
    return process


# Processes that belong to one side only: a run is charged its own side's and the shared
# ones' (PostgreSQL, Temporal, the sandbox), never another side's idle pollers.
def _side(process: str) -> str | None:
    if process.startswith("floor-worker"):
        return "floor"
    if process.startswith("samework-"):
        return "samework"
    if process == "relay" or process.startswith("worker"):
        return "product"
    return None


def counts_for(kind: str, process: str) -> bool:
    """Whether a run of `kind` is charged `process`'s CPU."""
    if process in ("bench", "bare-endpoint"):
        return False
    side = _side(process)
    return side is None or side == ("floor" if kind.startswith("floor") else kind)


def cpu_per_item(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """CPU ms per item by role and summed, per kind of run (median over rounds), and the
    product's sum over the product-shape floor's and the plain floor's, within each round
    (same server, same minutes: the steadier figure on a shared machine) and of the medians.
    The load generator (`bench`) and the bare ingress endpoint are left out."""
    per_kind: dict[str, list[dict[str, float]]] = {}
    for run in runs:
        cpu, items = run.get("cpu_seconds"), run.get("settled", run.get("workflows"))
        if run.get("error") or not cpu or not items:
            continue
        roles: dict[str, float] = {}
        for process, seconds in cpu.items():
            if not counts_for(run["kind"], process):
                continue
            # A negative delta is a measuring artefact (children that exited before
            # bench.common.cpu_seconds counted the waited-for ones), never work done.
            roles[_group(process)] = (roles.get(_group(process), 0.0)
                                      + max(seconds, 0.0) * 1000 / items)
        roles["total"] = sum(roles.values())
        roles["round"] = run["round"]
        per_kind.setdefault(run["kind"], []).append(roles)

    def median(values: list[float]) -> float:
        ordered = sorted(values)
        return round(ordered[len(ordered) // 2], 1) if ordered else float("nan")

    out: dict[str, Any] = {"unit": "CPU ms per item (product, samework: per settled email; "
                                   "floors: per workflow); load generator excluded; each "
                                   "run charged its own side's processes and the shared ones"}
    for kind, rounds in per_kind.items():
        roles = sorted({k for r in rounds for k in r if k != "round"})
        out[kind] = {role: median([r.get(role, 0.0) for r in rounds]) for role in roles}
    by_round: list[dict[str, Any]] = []
    for product in per_kind.get("product", []):
        row: dict[str, Any] = {"round": product["round"] + 1}
        for kind, key in (("floor-same-shape", "vs_same_shape"), ("floor", "vs_plain_floor")):
            other = next((r for r in per_kind.get(kind, []) if r["round"] == product["round"]),
                         None)
            if other and other["total"]:
                row[key] = round(product["total"] / other["total"], 3)
        by_round.append(row)
    out["ratio_by_round"] = by_round
    for kind, key in (("floor-same-shape", "ratio_vs_same_shape"),
                      ("floor", "ratio_vs_plain_floor")):
        if "product" in out and kind in out and out[kind].get("total"):
            out[key] = round(out["product"]["total"] / out[kind]["total"], 3)
    out["target_ratio_vs_same_shape"] = 1.2
    product = out.get("product")
    if product and STAND_IN_ROLES & set(product):
        # What a deployment runs: the product's processes, without the destination stand-in
        # (the sandbox and its own PostgreSQL server) that plays HubSpot and Resend here.
        own = product["total"] - sum(product.get(role, 0.0) for role in STAND_IN_ROLES)
        out["product_without_stand_in"] = round(own, 1)
        for kind, key in (("floor-same-shape", "own_ratio_vs_same_shape"),
                          ("floor", "own_ratio_vs_plain_floor")):
            if kind in out and out[kind].get("total"):
                out[key] = round(own / out[kind]["total"], 3)
    return out


async def profiled_run(h: Handles, client: Client, opts: Options, log: Any
                       ) -> dict[str, Any]:
    """One more product run, not counted in the figures above, with the instruments of
    bench/profile.py attached: sampling profiles of the workers and the relay, statements and
    round trips, history events by type, bytes through the codec; all per item."""
    n = opts.profile_n
    targets = {name: pid for name, pid in h.pids.items()
               if name.startswith("worker") or name == "relay"}
    log(f"profiled product run: {n} emails (py-spy on {', '.join(targets)}"
        f"{', pg_stat_statements' if h.statements else ''})")
    codec_before = await profile.codec_bytes(h.worker_metrics_urls)
    storage_before = await profile.storage(h.db)
    calls_before = await profile.destination_calls(h.sandbox_url)
    for db in profile.statement_servers(h):
        await profile.track_statements(db, True)
    profiler = profile.Profiler(targets)
    profiling = profiler.start()
    run = await run_product(h, opts, opts.repeat, n)
    if profiling:
        profiler.stop()
    out: dict[str, Any] = {"emails": n, "run": run}
    if run.get("error"):
        h.restart_relay()
        return out
    items = run["settled"] or 1
    for db in profile.statement_servers(h):
        out.setdefault("postgres", {}).update(await profile.read_statements(
            db, items, exclude={PRODUCT_PROGRESS, PRODUCT_TIMES}))
        await profile.track_statements(db, False)
    storage_after = await profile.storage(h.db)
    calls_after = await profile.destination_calls(h.sandbox_url)
    out["storage_bytes_per_item"] = {
        key: round((storage_after[key] - storage_before[key]) / items, 1) for key in storage_after}
    out["destination_calls_per_item"] = {
        target: round((calls_after[target] - calls_before.get(target, 0)) / items, 3)
        for target in sorted(calls_after) if calls_after[target] > calls_before.get(target, 0)}
    codec_after = await profile.codec_bytes(h.worker_metrics_urls)
    out["codec_bytes_per_item"] = {
        direction: round((codec_after.get(direction, 0.0) - codec_before.get(direction, 0.0))
                         / items) for direction in sorted(codec_after)}
    prefix = f"tp-{h.run_id}-{opts.repeat}-"
    rows = await h.db.fetch(
        "SELECT workflow_id, state, reason FROM inbound_events "
        "WHERE tenant = $1 AND delivery_id LIKE $2", "acme", prefix + "%")
    out["history"] = await profile.history_counts(
        client, [(r["workflow_id"], f"{r['state']}/{r['reason']}") for r in rows])
    out["profiles"] = (profiler.summaries(items, run.get("cpu_seconds") or {}) if profiling
                       else {"error": profiler.errors})
    log(f"  profiled: {run['per_second']}/s; history {out['history'].get('events_per_item')} "
        f"events per item; statements "
        f"{(out.get('postgres') or {}).get('product', {}).get('round_trips_per_item')} round "
        f"trips per item; codec {out['codec_bytes_per_item']} bytes per item")
    return out


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def same_work_summary(runs: list[dict[str, Any]], cpu: dict[str, Any]) -> dict[str, Any] | None:
    """The product against the same-work floor (bench/samework.py, issue 38): CPU per email
    summed over every process (relay, workers, PostgreSQL, Temporal, the sandbox and its
    PostgreSQL), throughput, both as product / floor (medians over the rounds, and by round),
    and where the product's extra CPU goes, by process (ms per email, product minus floor).
    None when no same-work run settled."""
    product, same = cpu.get("product"), cpu.get("samework")
    rates = {kind: _median([r["per_second"] for r in runs if r["kind"] == kind
                            and not r.get("error") and r.get("per_second")])
             for kind in ("product", "samework")}
    if not same or not rates["samework"]:
        return None
    out: dict[str, Any] = {
        "floor": "samework",
        "what": "the same required work on the same Temporal server, PostgreSQL and sandbox: "
                "signature, delivery insert ON CONFLICT DO NOTHING, one workflow per delivery "
                "ID (REJECT_DUPLICATE), sender parse, one transaction (contact + intent + "
                "outbox), CRM upsert + note + association, send with an idempotency key, each "
                "result recorded; local activities, no workflow sandbox",
        "cpu_ms_per_email": {"product": product.get("total") if product else None,
                             "samework": same.get("total")},
        "per_second": rates,
        "cpu_ratio": ratio(product.get("total") if product else None, same.get("total")),
        "throughput_ratio": ratio(rates["product"], rates["samework"]),
        "target_cpu_ratio": 1.10,
        "target_throughput_ratio": 0.95,
        "extra_cpu_ms_by_process": extra_by_role(product or {}, same),
    }
    by_round = []
    for run in runs:
        if run["kind"] != "product" or run.get("error"):
            continue
        twin = next((r for r in runs if r["kind"] == "samework" and r["round"] == run["round"]
                     and not r.get("error")), None)
        if twin:
            by_round.append({"round": run["round"] + 1,
                             "throughput_ratio": ratio(run["per_second"], twin["per_second"])})
    out["throughput_ratio_by_round"] = by_round
    steps = {r["kind"]: (r.get("steps_per_item") or {}).get("history_events") for r in runs
             if r["kind"] in ("product", "samework") and r.get("steps_per_item")}
    out["history_events_per_item"] = steps
    out["history_event_types"] = event_type_diff(runs)
    return out


def event_type_diff(runs: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """History events of one item by type, product and same-work floor side by side (the
    per-step view that costs nothing: each event is a server write and a worker round trip)."""
    types = {r["kind"]: (r.get("steps_per_item") or {}).get("event_types") or {}
             for r in runs if r["kind"] in ("product", "samework") and not r.get("error")}
    product, same = types.get("product", {}), types.get("samework", {})
    return {name: {"product": product.get(name, 0), "samework": same.get(name, 0)}
            for name in sorted(set(product) | set(same))
            if product.get(name, 0) != same.get(name, 0)}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator to 3 places; None when either is missing or the floor is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def extra_by_role(product: dict[str, float], floor: dict[str, float]) -> dict[str, float]:
    """Product minus floor, CPU ms per email, by role (largest first); `total` last."""
    roles = sorted((set(product) | set(floor)) - {"total", "round"})
    extra = {role: round(product.get(role, 0.0) - floor.get(role, 0.0), 1) for role in roles}
    ordered = dict(sorted(extra.items(), key=lambda kv: -kv[1]))
    ordered["total"] = round(product.get("total", 0.0) - floor.get("total", 0.0), 1)
    return ordered
