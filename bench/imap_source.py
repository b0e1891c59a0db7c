"""The IMAP source against the webhook source (`make bench-imap`, issue 34), on one fresh
stack of its own and one run: a real Dovecot (Debian's `dovecot-imapd`, tests/helpers/dovecot.py)
on loopback with a mailbox of its own, watched by the product's watcher (`inboxcrm mailbox
add imap`, the default rhythm: IDLE, one connection); the same kind of mail posted to
`POST /v1/inbound/standard` as a provider would.

Two phases, each run for both sources (webhook first in the paced phase, IMAP first in the
burst, so that neither always meets the lighter Temporal store):

- **paced** (`--paced`, default 40; `--rate` per second, default 2): one message at a time;
  per message the delay from the client's APPEND (or POST) to the item being stored
  (`inbound_events.received_at`) and to its end (the `state_changed` audit row of its final
  state), p50/p95;
- **burst** (`--n`, default 300): as fast as the client can append (one IMAP connection,
  APPEND after APPEND) or post (`--post-concurrency` lanes, default 50); items stored per
  second (last stored - first APPEND/POST) and settled per second (last settled - first).

Every figure of the IMAP source is also given as a ratio to the webhook's (IMAP ÷ webhook:
above 1 for delays means slower, below 1 for rates means fewer per second). Figures, never
pass/fail. Writes `bench/results/imap.json`.

    python -m bench.imap_source [--n 300] [--paced 40] [--rate 2] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import imaplib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/imap_source.py`
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    MAILBOX,
    TENANT,
    LaneClients,
    answer_of,
    person_name,
    run_bounded,
    sign,
    summary_ms,
)

USER = "bench"
PASSWORD = "imap-bench-password"
PASSWORD_ENV = "INBOXCRM_BENCH_IMAP_PASSWORD"
FOLDER = "INBOX"
SETTLED = ("completed", "ignored", "suppressed", "rejected", "failed", "awaiting_review",
           "blocked", "ambiguous", "held")
TIMES = """
SELECT e.delivery_id, e.message_id, e.state,
       extract(epoch FROM e.received_at)::float8 AS stored,
       (SELECT extract(epoch FROM min(a.at))::float8 FROM audit_log a
        WHERE a.workflow_id = e.workflow_id AND a.action = 'state_changed'
          AND a.detail->>'state' = e.state) AS settled
FROM inbound_events e
WHERE e.tenant = $1 AND (e.delivery_id = ANY($2::text[]) OR e.message_id = ANY($3::text[]))
"""


def log(line: str) -> None:
    print(f"[imap {time.strftime('%H:%M:%S')}] {line}", flush=True)


def message(email: str, i: int, message_id: str) -> str:
    from inboxcrm.verify.signing import sample_message

    return sample_message(sender=f"{person_name(i)} <{email}>",
                          subject=f"Question {i}", message_id=message_id)


class Appender:
    """One IMAP connection of the benchmark's own, APPENDing to the watched folder: the
    client side of the delay (its own session, outside the watcher's cap)."""

    def __init__(self, port: int) -> None:
        self.conn = imaplib.IMAP4("127.0.0.1", port)
        self.conn.login(USER, PASSWORD)

    def append(self, raw: str) -> float:
        """APPEND one message; the wall-clock time just before the command was sent."""
        started = time.time()
        status, _ = self.conn.append(FOLDER, None, None, raw.encode())
        if status != "OK":
            raise RuntimeError(f"APPEND answered {status}")
        return started

    def close(self) -> None:
        with contextlib.suppress(imaplib.IMAP4.error, OSError):
            self.conn.logout()


class Sources:
    """Both sources' clients, and the send time of every message keyed as the store keys it
    (the webhook's delivery ID, the IMAP message's Message-ID)."""

    def __init__(self, stack: Any, appender: Appender, run_id: str, lanes: int) -> None:
        self.url = f"{stack.relay_url}/v1/inbound/standard"
        self.secret = stack.env["INBOXCRM_WEBHOOK_SECRET"]
        self.appender = appender
        self.run_id = run_id
        self.http = LaneClients(lanes)
        self.sent: dict[str, float] = {}
        self.answers: Counter[str] = Counter()
        self.count = 0

    def _next(self, kind: str) -> tuple[int, str, str]:
        self.count += 1
        i = self.count
        key = f"{kind}-{self.run_id}-{i:05d}"
        return i, key, f"{key}@example.com"

    async def post(self, lane: int = 0) -> str:
        i, key, email = self._next("wh")
        req = sign(self.secret, key, message(email, i, f"<{key}@bench.example>"))
        self.sent[key] = time.time()
        try:
            response = await self.http[lane].post(self.url, content=req.body,
                                                  headers=req.headers)
            self.answers[answer_of(response)] += 1
        except Exception as exc:  # noqa: BLE001 - counted
            self.answers[type(exc).__name__] += 1
        return key

    async def append(self) -> str:
        i, key, email = self._next("im")
        message_id = f"<{key}@bench.example>"
        self.sent[message_id] = await asyncio.to_thread(
            self.appender.append, message(email, i, message_id))
        return message_id

    async def aclose(self) -> None:
        await self.http.aclose()


async def settled(db: Any, keys: list[str], timeout: float) -> list[Any]:
    """The store's rows of these messages once all are settled (or at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = list(await db.fetch(TIMES, TENANT, keys, keys))
        done = [r for r in rows if r["state"] in SETTLED and r["settled"] is not None]
        if len(done) >= len(keys) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.25)


def key_of(row: Any) -> str:
    return str(row["message_id"]) if str(row["delivery_id"]).startswith(FOLDER + ":") \
        else str(row["delivery_id"])


def paced_figures(rows: list[Any], sent: dict[str, float]) -> dict[str, Any]:
    stored = [r["stored"] - sent[key_of(r)] for r in rows if key_of(r) in sent]
    done = [r["settled"] - sent[key_of(r)] for r in rows
            if key_of(r) in sent and r["state"] == "completed" and r["settled"] is not None]
    return {"items": len(rows), "states": dict(Counter(r["state"] for r in rows)),
            "to_stored_ms": summary_ms(stored), "to_done_ms": summary_ms(done)}


def burst_figures(rows: list[Any], sent: dict[str, float], keys: list[str]) -> dict[str, Any]:
    first = min(sent[k] for k in keys)
    stored = [r["stored"] for r in rows]
    ended = [r["settled"] for r in rows if r["state"] in SETTLED and r["settled"] is not None]
    last_sent = max(sent[k] for k in keys)
    out: dict[str, Any] = {"messages": len(keys), "stored": len(stored), "settled": len(ended),
                           "states": dict(Counter(r["state"] for r in rows)),
                           "send_seconds": round(last_sent - first, 2)}
    if stored:
        out["stored_per_second"] = round(len(stored) / max(max(stored) - first, 1e-3), 2)
        out["stored_seconds"] = round(max(stored) - first, 2)
    if ended:
        out["settled_per_second"] = round(len(ended) / max(max(ended) - first, 1e-3), 2)
        out["settled_seconds"] = round(max(ended) - first, 2)
    per_item = [r["stored"] - sent[key_of(r)] for r in rows if key_of(r) in sent]
    out["to_stored_ms"] = summary_ms(per_item)
    return out


async def paced(sources: Sources, db: Any, kind: str, count: int, rate: float,
                timeout: float) -> dict[str, Any]:
    keys, tasks = [], []
    for _ in range(count):
        if kind == "imap":
            keys.append(await sources.append())
        else:
            task = asyncio.ensure_future(sources.post())
            tasks.append(task)
        await asyncio.sleep(1.0 / rate)
    keys += await asyncio.gather(*tasks)
    rows = await settled(db, keys, timeout)
    return paced_figures(rows, sources.sent)


async def burst(sources: Sources, db: Any, kind: str, count: int, lanes: int,
                timeout: float) -> dict[str, Any]:
    keys: list[str] = []
    if kind == "imap":
        for _ in range(count):
            keys.append(await sources.append())
    else:
        async def one(_i: int, lane: int) -> None:
            keys.append(await sources.post(lane))

        await run_bounded(count, lanes, one, timeout)
    rows = await settled(db, keys, timeout)
    return burst_figures(rows, sources.sent, keys)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    """IMAP ÷ webhook for every figure both have."""
    out: dict[str, Any] = {}
    p_imap, p_web = result["paced"]["imap"], result["paced"]["webhook"]
    for figure in ("to_stored_ms", "to_done_ms"):
        for q in ("p50", "p95"):
            out[f"paced_{figure}_{q}"] = ratio(p_imap[figure].get(q), p_web[figure].get(q))
    b_imap, b_web = result["burst"]["imap"], result["burst"]["webhook"]
    for figure in ("stored_per_second", "settled_per_second"):
        out[f"burst_{figure}"] = ratio(b_imap.get(figure), b_web.get(figure))
    for q in ("p50", "p95"):
        out[f"burst_to_stored_ms_{q}"] = ratio(b_imap["to_stored_ms"].get(q),
                                               b_web["to_stored_ms"].get(q))
    return out


def register(stack: Any, port: int) -> None:
    env = dict(stack.env)
    done = subprocess.run(
        [sys.executable, "-m", "inboxcrm.cli", "mailbox", "add", "imap", "--tenant", TENANT,
         "--address", MAILBOX, "--host", "127.0.0.1", "--port", str(port), "--tls", "none",
         "--username", USER, "--password-env", PASSWORD_ENV, "--folder", FOLDER,
         "--max-connections", "1"],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"mailbox add: {done.stderr[-500:]}")


async def run(stack: Any, server: Any, args: argparse.Namespace) -> dict[str, Any]:
    from inboxcrm.store import db as inboxcrm_db

    pool = await inboxcrm_db.create_pool(stack.database_url, max_size=4)
    appender = await asyncio.to_thread(Appender, server.port)
    sources = Sources(stack, appender, uuid.uuid4().hex[:6], args.post_concurrency)
    try:
        await asyncio.to_thread(register, stack, server.port)
        # Warm-up (not counted): the watcher connected and IDLE, caches and connections warm.
        warm = [await sources.append() for _ in range(5)] + [await sources.post()
                                                             for _ in range(5)]
        rows = await settled(pool, warm, 180)
        if len(rows) < len(warm):
            raise RuntimeError(f"warm-up: {len(rows)} of {len(warm)} items stored")
        result: dict[str, Any] = {"paced": {}, "burst": {}}
        for kind in ("webhook", "imap"):
            log(f"paced: {args.paced} {kind} messages at {args.rate}/s")
            result["paced"][kind] = await paced(sources, pool, kind, args.paced, args.rate,
                                                args.timeout)
        for kind in ("imap", "webhook"):
            log(f"burst: {args.n} {kind} messages as fast as they go")
            result["burst"][kind] = await burst(sources, pool, kind, args.n,
                                                args.post_concurrency, args.timeout)
        result["ratio_imap_to_webhook"] = ratios(result)
        result["answers"] = dict(sources.answers)
        result["dovecot_logins"] = server.logins(USER)
        return result
    finally:
        await sources.aclose()
        await asyncio.to_thread(appender.close)
        await pool.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.imap_source", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="burst 60, paced 15 (~3 min)")
    parser.add_argument("--n", type=int, help="messages per source in the burst (300)")
    parser.add_argument("--paced", type=int, help="messages per source, paced (40)")
    parser.add_argument("--rate", type=float, default=2.0, help="paced messages per second")
    parser.add_argument("--post-concurrency", type=int, default=50,
                        help="the webhook burst's concurrent posts")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    args.n = args.n or (60 if args.quick else 300)
    args.paced = args.paced or (15 if args.quick else 40)
    return args


def rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    def lat(s: dict[str, Any]) -> str:
        return f"p50 {s['p50']} / p95 {s['p95']} ms ({s['count']})" if s.get("count") else "-"

    def rate(b: dict[str, Any], figure: str) -> str:
        return (f"{b.get(f'{figure}_per_second')}/s ({b.get(figure)}/{b['messages']} in "
                f"{b.get(f'{figure}_seconds')} s)")

    p, b, r = result["paced"], result["burst"], result["ratio_imap_to_webhook"]
    table = []
    for kind in ("imap", "webhook"):
        table += [(f"{kind}: send -> stored, paced", lat(p[kind]["to_stored_ms"]), ""),
                  (f"{kind}: send -> done, paced", lat(p[kind]["to_done_ms"]), ""),
                  (f"{kind}: burst stored", rate(b[kind], "stored"), ""),
                  (f"{kind}: burst settled",
                   f"{rate(b[kind], 'settled')}; states {b[kind]['states']}", ""),
                  (f"{kind}: send -> stored, burst", lat(b[kind]["to_stored_ms"]), "")]
    table += [(f"imap / webhook: {k}", str(v), "") for k, v in r.items()]
    return table


def main(argv: list[str] | None = None) -> int:
    from bench import report
    from bench.common import machine
    from bench.run import DATA_DIR, exclusive_data_dir, start_stack
    from bench.run import parse_args as bench_args
    from tests.helpers import dovecot

    args = parse_args(argv)

    def terminate(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)  # the stack and Dovecot stopped, whatever
    if not dovecot.available():
        print(dovecot.MISSING, file=sys.stderr)
        return 1
    result: dict[str, Any] = {"label": "imap", "started_at": time.time(),
                              "machine": machine(), "options": vars(args)}
    # Dovecot's processes (user `dovecot`) must reach its files: not under a private home.
    root = Path(tempfile.mkdtemp(prefix="inboxcrm-bench-dovecot-"))
    server = dovecot.Dovecot(root).start({USER: PASSWORD})
    try:
        with exclusive_data_dir("imap"):
            stack = start_stack(bench_args(["--workers", str(args.workers)]))
            stack.config.extra_env[PASSWORD_ENV] = PASSWORD
            stack.config.workers = max(1, args.workers)
            try:
                log(f"starting a fresh stack under {DATA_DIR} ({args.workers} workers), "
                    f"Dovecot on 127.0.0.1:{server.port}")
                stack.start_all()
                result["imap"] = asyncio.run(run(stack, server, args))
            except KeyboardInterrupt:
                return 130
            finally:
                stack.stop()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print()
    print(report.format_table(rows(result["imap"])))
    path = report.RESULTS / "imap.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwritten: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
