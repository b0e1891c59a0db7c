"""The noisy-neighbour benchmark (`make bench-neighbour`, issue 38): one installation, two
tenants. Tenant A (`acme`) sends a burst as fast as the relay accepts it; tenant B (`beta`,
a copy of acme's policy on its own mailbox, written into the run's own policy directory)
sends ordinary mail at a steady rate, first alone and then during A's burst.

Reports B's accepted -> done p50/p95 alone and under the burst (from the store:
`inbound_events.received_at` -> the `state_changed` audit row of its final state), A's
emails/s, the relay's answers (a 429 is retried after its Retry-After, as a provider does)
and, on the destination (`GET /_sandbox/state`), that every sender has exactly one contact
and at most one follow-up: nothing lost, nothing duplicated. Figures, never pass/fail; the
target (B's p95 under the burst <= max(2 x alone, alone + 1 s)) is printed beside them.

    python -m bench.neighbour [--burst 600] [--b-rate 1.0] [--b-alone 20] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/neighbour.py`
    sys.path.insert(0, str(ROOT))

from bench.common import LaneClients, answer_of, inquiry, person_name, summary_ms  # noqa: E402

TENANT_A, MAILBOX_A = "acme", "sales@acme.test"
TENANT_B, MAILBOX_B = "beta", "sales@beta.test"
SETTLED = ("completed", "ignored", "suppressed", "rejected", "failed", "awaiting_review",
           "blocked", "ambiguous", "held")
TIMES = """
SELECT e.delivery_id, e.workflow_id, e.state, e.reason,
       extract(epoch FROM e.received_at)::float8 AS received,
       (SELECT extract(epoch FROM min(a.at))::float8 FROM audit_log a
        WHERE a.workflow_id = e.workflow_id AND a.action = 'state_changed'
          AND a.detail->>'state' = e.state) AS settled
FROM inbound_events e WHERE e.tenant = $1 AND e.delivery_id LIKE $2
"""


def log(line: str) -> None:
    print(f"[neighbour {time.strftime('%H:%M:%S')}] {line}", flush=True)


def write_policies(target: Path, a_intake: float | None = None) -> Path:
    """The repository's policies plus tenant `beta`: acme's policy and templates on its own
    mailbox and domain (the relay's shared Standard Webhooks secret may write into it).
    `a_intake`: tenant A's relay intake rate per relay process (`capacity.intake_per_second`,
    burst two seconds' worth), None: the policy's own (none)."""
    shutil.copytree(ROOT / "policies", target)
    if a_intake is not None:
        acme = json.loads((target / "acme.json").read_text())
        acme["capacity"] = dict(acme.get("capacity") or {}, intake_per_second=a_intake,
                                intake_burst=max(1, round(2 * a_intake)))
        (target / "acme.json").write_text(json.dumps(acme, indent=2))
    beta = json.loads((ROOT / "policies" / "acme.json").read_text())
    beta.update(tenant=TENANT_B, mailboxes=[MAILBOX_B], domains=["beta.test"])
    beta["sender"] = dict(beta["sender"], **{"from": f"Beta Sales <{MAILBOX_B}>",
                                              "reply_to": f"Beta Sales <{MAILBOX_B}>"})
    (target / "beta.json").write_text(json.dumps(beta, indent=2))
    shutil.copytree(ROOT / "policies" / "acme", target / TENANT_B)
    return target


def target_p95_ms(alone_p95_ms: float) -> float:
    """Issue 38's bound for B under A's burst: twice its p95 alone, or alone + 1 s,
    whichever is larger."""
    return max(2 * alone_p95_ms, alone_p95_ms + 1000.0)


def destination_check(state: dict[str, Any], senders: dict[str, str],
                      followups: dict[str, int]) -> dict[str, Any]:
    """On the sandbox's records: per tenant, senders without a contact (lost), senders with
    more than one contact (duplicated), follow-ups sent more than once to one address, and
    follow-ups sent against the items the product says sent one. `senders`: address ->
    tenant; `followups`: tenant -> items whose reason is followup_sent."""
    contacts: Counter[str] = Counter()
    for contact in state.get("contacts", []):
        email = str((contact.get("properties") or {}).get("email", "")).lower()
        if email in senders:
            contacts[email] += 1
    sent: Counter[str] = Counter()
    for mail in state.get("emails", []):
        for address in mail.get("to") or []:
            if address.lower() in senders:
                sent[address.lower()] += 1
    out: dict[str, Any] = {}
    for tenant in sorted(set(senders.values())):
        mine = [a for a, t in senders.items() if t == tenant]
        out[tenant] = {
            "senders": len(mine),
            "contacts_missing": sum(1 for a in mine if contacts[a] == 0),
            "contacts_duplicated": sum(1 for a in mine if contacts[a] > 1),
            "followups_sent": sum(sent[a] for a in mine),
            "followups_duplicated": sum(1 for a in mine if sent[a] > 1),
            "followups_expected": followups.get(tenant, 0),
        }
        row = out[tenant]
        row["ok"] = (row["contacts_missing"] == 0 and row["contacts_duplicated"] == 0
                     and row["followups_duplicated"] == 0
                     and row["followups_sent"] == row["followups_expected"])
    return out


class Sender:
    """Signed posts of one tenant to the relay; a 429 or 503 is retried after Retry-After."""

    def __init__(self, relay_url: str, secret: str, tenant: str, mailbox: str, prefix: str,
                 lanes: int) -> None:
        self.url = f"{relay_url}/v1/inbound/standard"
        self.secret, self.tenant, self.mailbox, self.prefix = secret, tenant, mailbox, prefix
        self.http = LaneClients(lanes)
        self.answers: Counter[str] = Counter()
        self.throttled = 0
        self.senders: dict[str, str] = {}

    async def post(self, i: int, lane: int) -> None:
        from inboxcrm.verify.signing import signed_headers, standard_body

        address = f"{self.prefix}{i}@example.com"
        self.senders[address] = self.tenant
        raw = inquiry(address, person_name(i), f"Question {i}").replace(MAILBOX_A, self.mailbox)
        delivery = f"{self.prefix}{i:05d}"
        body = standard_body(self.tenant, self.mailbox, delivery, raw)
        msg_id = f"msg_{self.prefix}{i}"
        for _attempt in range(20):
            try:
                response = await self.http[lane].post(
                    self.url, content=body, headers=signed_headers(self.secret, body,
                                                                   msg_id=msg_id))
            except Exception as exc:  # noqa: BLE001 - counted, retried
                self.answers[type(exc).__name__] += 1
                await asyncio.sleep(1.0)
                continue
            answer = answer_of(response)
            if response.status_code in (429, 503):
                self.throttled += 1
                try:
                    wait = float(response.headers.get("retry-after", "1"))
                except ValueError:
                    wait = 1.0
                await asyncio.sleep(min(max(wait, 0.1), 30.0))
                continue
            self.answers[answer] += 1
            return
        self.answers["gave_up"] += 1


async def burst(sender: Sender, count: int, lanes: int) -> float:
    """Post `count` deliveries from `lanes` concurrent lanes; returns the first post's time."""
    started = time.time()
    next_i = 0

    async def lane(k: int) -> None:
        nonlocal next_i
        while next_i < count:
            i, next_i = next_i, next_i + 1
            await sender.post(i, k)

    await asyncio.gather(*(lane(k) for k in range(min(lanes, count))))
    return started


async def steady(sender: Sender, start: int, rate: float, until: asyncio.Event,
                 at_least: int) -> int:
    """One post every 1/rate seconds (each in its own task, as separate deliveries arrive)
    until `until` is set and at least `at_least` were posted; returns how many."""
    tasks, i = [], start
    while not until.is_set() or i - start < at_least:
        tasks.append(asyncio.ensure_future(sender.post(i, i)))
        i += 1
        await asyncio.sleep(1.0 / rate)
    await asyncio.gather(*tasks)
    return i - start


async def settled_rows(db: Any, tenant: str, prefix: str, want: int, timeout: float
                       ) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        rows = await db.fetch(TIMES, tenant, prefix + "%")
        done = [r for r in rows if r["state"] in SETTLED and r["settled"] is not None]
        if len(done) >= want or time.monotonic() > deadline:
            return list(rows)
        await asyncio.sleep(0.5)


async def phases(client: Any, rows: list[Any], only: set[str],
                 since: float | None = None) -> dict[str, Any]:
    """Where B's completed items spent their time, from their Temporal histories: `relay`
    (accepted -> workflow started), `queued` (started -> its first workflow task handed to a
    worker: the matching service's queue, where fairness applies) and `worker` (that -> its
    final state recorded: the steps inside the worker)."""
    from temporalio.api.enums.v1 import EventType

    relay, queued, worker = [], [], []
    timeline: list[dict[str, float | int]] = []
    for r in rows:
        if r["delivery_id"] not in only or r["state"] != "completed" or r["settled"] is None:
            continue
        history = await client.get_workflow_handle(r["workflow_id"]).fetch_history()
        started = first_task = None
        tasks = 0
        for event in history.events:
            at = event.event_time.ToDatetime().timestamp()
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                started = at
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                first_task = at if first_task is None else first_task
                tasks += 1
        if started is None or first_task is None:
            continue
        relay.append(started - r["received"])
        queued.append(first_task - started)
        worker.append(r["settled"] - first_task)
        if since is not None:
            timeline.append({"at_s": round(r["received"] - since, 2),
                             "relay_ms": round((started - r["received"]) * 1000),
                             "queued_ms": round((first_task - started) * 1000),
                             "worker_ms": round((r["settled"] - first_task) * 1000),
                             "workflow_tasks": tasks})
    out: dict[str, Any] = {"relay_ms": summary_ms(relay), "queued_ms": summary_ms(queued),
                           "worker_ms": summary_ms(worker)}
    if since is not None:
        # Each item: when it was accepted (seconds after A's first post) and its phases,
        # so a tail can be placed in the burst (its start, its drain, its end).
        out["timeline"] = sorted(timeline, key=lambda item: item["at_s"])
    return out


def latencies(rows: list[Any], only: set[str] | None = None) -> dict[str, Any]:
    values = [r["settled"] - r["received"] for r in rows
              if r["state"] == "completed" and r["settled"] is not None
              and (only is None or r["delivery_id"] in only)]
    return summary_ms(values)


async def run(stack: Any, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from inboxcrm.store import db as inboxcrm_db

    run_id = uuid.uuid4().hex[:6]
    secret = stack.env["INBOXCRM_WEBHOOK_SECRET"]
    pool = await inboxcrm_db.create_pool(stack.database_url, max_size=4)
    try:
        b_prefix, a_prefix = f"nb-{run_id}-b-", f"nb-{run_id}-a-"
        b = Sender(stack.relay_url, secret, TENANT_B, MAILBOX_B, b_prefix, 4)
        a = Sender(stack.relay_url, secret, TENANT_A, MAILBOX_A, a_prefix, args.lanes)
        # Warm-up (not counted): a few of each tenant's, so caches and connections are warm.
        warm_a = Sender(stack.relay_url, secret, TENANT_A, MAILBOX_A, f"nb-{run_id}-wa-", 4)
        warm_b = Sender(stack.relay_url, secret, TENANT_B, MAILBOX_B, f"nb-{run_id}-wb-", 4)
        await asyncio.gather(*(s.post(i, i) for s in (warm_a, warm_b) for i in range(5)))
        await settled_rows(pool, TENANT_A, warm_a.prefix, 5, 120)
        await settled_rows(pool, TENANT_B, warm_b.prefix, 5, 120)

        log(f"B alone: {args.b_alone} emails at {args.b_rate}/s")
        done = asyncio.Event()
        done.set()
        alone_n = await steady(b, 0, args.b_rate, done, args.b_alone)
        alone_rows = await settled_rows(pool, TENANT_B, b_prefix, alone_n, 120)
        alone_ids = {r["delivery_id"] for r in alone_rows}

        log(f"A's burst of {args.burst} ({args.lanes} lanes) with B at {args.b_rate}/s")
        a_done = asyncio.Event()

        async def a_side() -> tuple[float, list[Any]]:
            started = await burst(a, args.burst, args.lanes)
            # A delivery refused 20 times is given up (reported), as a provider gives up.
            rows = await settled_rows(pool, TENANT_A, a_prefix,
                                      args.burst - a.answers["gave_up"], args.timeout)
            a_done.set()
            return started, rows

        (a_started, a_rows), under_n = await asyncio.gather(
            a_side(), steady(b, alone_n, args.b_rate, a_done, max(5, args.b_alone // 2)))
        b_rows = await settled_rows(pool, TENANT_B, b_prefix, alone_n + under_n, 120)
        under_ids = {r["delivery_id"] for r in b_rows} - alone_ids
        a_settled = [r for r in a_rows if r["state"] in SETTLED and r["settled"] is not None]
        a_last = max((r["settled"] for r in a_settled), default=a_started)
        async with httpx.AsyncClient(timeout=60) as http:
            state = (await http.get(f"{stack.sandbox_url}/_sandbox/state")).json()
        followups = {TENANT_A: sum(r["reason"] == "followup_sent" for r in a_rows),
                     TENANT_B: sum(r["reason"] == "followup_sent" for r in b_rows)}
        alone, under = latencies(b_rows, alone_ids), latencies(b_rows, under_ids)
        from temporalio.client import Client

        temporal = await Client.connect(stack.temporal_address)
        b_phases = {"alone": await phases(temporal, b_rows, alone_ids),
                    "under_burst": await phases(temporal, b_rows, under_ids, a_started)}
        out: dict[str, Any] = {
            "b_alone_ms": alone,
            "b_under_burst_ms": under,
            "b_phases_ms": b_phases,
            "b_p95_ratio": (round(under["p95"] / alone["p95"], 2)
                            if alone.get("p95") and under.get("p95") else None),
            "target_b_p95_under_burst_ms": (round(target_p95_ms(alone["p95"]), 1)
                                            if alone.get("p95") else None),
            "a": {"emails": args.burst, "settled": len(a_settled),
                  "states": dict(Counter(r["state"] for r in a_rows)),
                  "elapsed_seconds": round(a_last - a_started, 2),
                  "per_second": round(len(a_settled) / (a_last - a_started), 2)
                  if a_last > a_started else None,
                  "answers": dict(a.answers), "throttled": a.throttled},
            "b": {"emails": alone_n + under_n, "alone": alone_n, "under_burst": under_n,
                  "states": dict(Counter(r["state"] for r in b_rows)),
                  "answers": dict(b.answers), "throttled": b.throttled},
            "destination": destination_check(state, {**a.senders, **b.senders}, followups),
        }
        return out
    finally:
        await pool.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.neighbour", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="burst 60, B alone 8 (~2 min)")
    parser.add_argument("--burst", type=int, help="tenant A's emails (default 600)")
    parser.add_argument("--b-rate", type=float, default=1.0, help="B's emails per second")
    parser.add_argument("--b-alone", type=int, help="B's emails alone (default 20)")
    parser.add_argument("--lanes", type=int, default=50, help="A's concurrent posts")
    parser.add_argument("--a-intake", type=float, default=None,
                        help="A's relay intake per second (capacity.intake_per_second); "
                             "default: acme's policy (no limit)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    args.burst = args.burst or (60 if args.quick else 600)
    args.b_alone = args.b_alone or (8 if args.quick else 20)
    return args


def rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    def lat(s: dict[str, Any]) -> str:
        return f"p50 {s['p50']} / p95 {s['p95']} ms ({s['count']})" if s.get("count") else "-"

    a, b = result["a"], result["b"]
    target = result.get("target_b_p95_under_burst_ms")
    return [
        ("B accepted -> done, alone", lat(result["b_alone_ms"]), ""),
        ("B accepted -> done, under A's burst", lat(result["b_under_burst_ms"]),
         f"p95 <= {target} ms" if target else ""),
        ("B p95 under burst / alone", str(result.get("b_p95_ratio")), ""),
        *((f"B {when}: {name} (p50 / p95 ms)",
           f"{s.get('p50')} / {s.get('p95')}" if s.get("count") else "-", "")
          for when, parts in result.get("b_phases_ms", {}).items()
          for name, s in parts.items() if name != "timeline"),
        ("A's burst", f"{a['per_second']} emails/s ({a['settled']}/{a['emails']} settled in "
         f"{a['elapsed_seconds']} s; states {a['states']}; answers {a['answers']}; "
         f"429/503 retried {a['throttled']})", ""),
        ("B", f"{b['emails']} emails ({b['alone']} alone, {b['under_burst']} under the burst); "
         f"states {b['states']}; answers {b['answers']}; 429/503 retried {b['throttled']}",
         ""),
        *((f"destination {tenant}", json.dumps(check), "ok: true")
          for tenant, check in result["destination"].items()),
    ]


def main(argv: list[str] | None = None) -> int:
    from bench import report
    from bench.common import machine
    from bench.run import DATA_DIR, exclusive_data_dir, start_stack
    from bench.run import parse_args as bench_args

    args = parse_args(argv)
    result: dict[str, Any] = {"label": "neighbour", "started_at": time.time(),
                              "machine": machine(), "options": vars(args)}
    with exclusive_data_dir("neighbour"):
        policies = write_policies(DATA_DIR / "policies", args.a_intake)
        stack = start_stack(bench_args(["--workers", str(args.workers)]))
        stack.config.extra_env["INBOXCRM_POLICY_DIR"] = str(policies)
        stack.config.workers = max(1, args.workers)
        try:
            log(f"starting a fresh stack under {DATA_DIR} ({args.workers} workers)")
            stack.start_all()
            result["neighbour"] = asyncio.run(run(stack, args))
        except KeyboardInterrupt:
            return 130
        finally:
            stack.stop()
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print()
    print(report.format_table(rows(result["neighbour"])))
    path = report.RESULTS / "neighbour.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwritten: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
