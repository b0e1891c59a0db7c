"""`inboxcrm recover`: bounded batch recovery (docs/architecture.md §6). After a cause is
fixed (a rotated CRM token, a corrected field mapping) an operator selects one tenant's items
blocked with one reason since a time, sees what each would do, approves once, and the
retries run one after another at a bounded rate.

Each retry is the same decision `inboxcrm review retry` sends (the one decision client,
`inboxcrm/platform/decisions.py`: the same reviewer authentication, the same Temporal update,
the same validator in the workflow), so a
retry reuses the step's operation key and nothing here can do what a single retry could not.
An ambiguous customer-facing send is not retried in bulk unless `--include-ambiguous` says
so: the provider may have accepted the first attempt, and a retry past its idempotency
window would send a second email."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Annotated, Any

import typer

from inboxcrm.cli.common import (
    DryRunOpt,
    JsonOpt,
    YesOpt,
    confirm,
    err,
    fail,
    out,
    parse_since,
    progress,
    settings_from_env,
    with_db,
)

MAX_LIMIT = 1000
MAX_RATE = 20.0
DEFAULT_RATE = 2.0
SEND_ACTION = "send"
AMBIGUOUS_SEND_WHY = (
    "ambiguous customer-facing send: the provider may already have accepted it, and a retry "
    "after its idempotency key's window can send a second email; check the destination "
    "(`inboxcrm review show`), then retry it alone or pass --include-ambiguous")
AMBIGUOUS_WHY = ("ambiguous: the write may already have happened; check the destination, "
                 "then pass --include-ambiguous")


@dataclass
class Planned:
    """One selected item: what a retry would do, and (after the run) what it did."""

    workflow_id: str
    state: str
    reason: str | None
    step: str | None
    op_key: str | None
    attempts: str | None
    blocked_at: str
    outcome: str = "would_retry"  # would_retry | accepted | refused | error
    new_state: str | None = None
    message: str | None = None


@dataclass
class Plan:
    selected: list[Planned] = field(default_factory=list)
    refused: list[Planned] = field(default_factory=list)  # not run, with why
    over_limit: int = 0


def validate(*, limit: int, rate: float) -> None:
    """The bounds, checked before anything is read: a batch is capped and paced."""
    if not 1 <= limit <= MAX_LIMIT:
        fail(f"--limit must be between 1 and {MAX_LIMIT}", 2)
    if not 0 < rate <= MAX_RATE:
        fail(f"--rate must be more than 0 and at most {MAX_RATE:g} retries a second", 2)


def plan(rows: list[dict[str, Any]], *, limit: int, include_ambiguous: bool) -> Plan:
    """Split the candidates (oldest first) into the at most `limit` to retry and the ones
    refused, each with why. Pure: the fast tests call it on rows as the store returns them."""
    result = Plan()
    for row in rows:
        item = Planned(
            workflow_id=row["workflow_id"], state=row["state"], reason=row["reason"],
            step=row.get("action"), op_key=row.get("op_key"),
            attempts=(f"{row['attempts']}/{row['max_attempts']}"
                      if row.get("attempts") is not None else None),
            blocked_at=str(row["blocked_at"]))
        allowed = row.get("allowed") or []
        if row["state"] == "ambiguous" and not include_ambiguous:
            item.outcome = "refused"
            item.message = AMBIGUOUS_SEND_WHY if item.step == SEND_ACTION else AMBIGUOUS_WHY
            result.refused.append(item)
        elif "retry" not in allowed:
            item.outcome = "refused"
            item.message = f"retry is not allowed at its wait (allowed: {', '.join(allowed)})"
            result.refused.append(item)
        elif len(result.selected) >= limit:
            result.over_limit += 1
        else:
            result.selected.append(item)
    return result


def _retry_one(item: Planned, reviewer: str, note: str) -> None:
    """One retry through the one decision client (`inboxcrm/platform/decisions.py`), as
    `inboxcrm review retry` sends it: accepted with the new state, or refused with the
    workflow's reason."""
    from rich.text import Text

    from inboxcrm.cli import review
    from inboxcrm.platform import temporal
    from inboxcrm.platform.decisions import DecisionRequest, send_decision
    from inboxcrm.platform.reviewer_identity import PATH_CLI
    from inboxcrm.schemas.contract import Decision

    settings = settings_from_env()
    secret = settings.decision_secret.get_secret_value() if settings.decision_secret else None
    with err.capture() as complaint:
        try:
            principal = review._acting_reviewer(settings, item.workflow_id)
            result = asyncio.run(send_decision(
                lambda: temporal.connect(settings, namespace=temporal.namespace_for_workflow(
                    settings, item.workflow_id)), secret,
                DecisionRequest(workflow_id=item.workflow_id, action=Decision.RETRY,
                                decider=principal, path=PATH_CLI, reviewer=reviewer,
                                note=note)))
        except typer.Exit as exc:
            item.outcome = "error"
            item.message = (Text.from_ansi(complaint.get()).plain.strip()
                            .removeprefix("error:").strip() or f"exit {exc.exit_code}")
            return
        except Exception as exc:  # noqa: BLE001 - one item's failure must not end the batch
            item.outcome, item.message = "error", f"{type(exc).__name__} (see `inboxcrm status`)"
            return
    if result.accepted and result.status is not None:
        item.outcome, item.new_state = "accepted", result.status.state
        return
    item.outcome = "refused" if result.outcome == "refused" else "error"
    item.message = result.message


def _line(item: Planned) -> str:
    parts = [item.workflow_id, item.state, item.reason or "-", f"step {item.step or '-'}",
             f"key {item.op_key or '-'}"]
    if item.attempts:
        parts.append(f"attempts {item.attempts}")
    return "  ".join(parts)


def render_text(chosen: Plan, header: dict[str, Any], *, ran: bool) -> list[str]:
    """The table a person reads: one line per selected item (what it would do, or what it
    did), one per item not retried with why, and the counts."""
    lines = []
    for item in chosen.selected:
        tail = {"would_retry": "would retry", "accepted": f"accepted: now {item.new_state}",
                }.get(item.outcome, f"{item.outcome}: {item.message}")
        lines.append(f"{_line(item)}  -> {tail}")
    lines += [f"{_line(item)}  -> not retried: {item.message}" for item in chosen.refused]
    counts = Counter(item.outcome for item in chosen.selected)
    summary = (f"{len(chosen.selected)} selected" if not ran else
               f"{counts['accepted']} accepted, {counts['refused']} refused, "
               f"{counts['error']} failed")
    lines.append(f"{summary}; {len(chosen.refused)} not retried; {chosen.over_limit} over "
                 f"--limit {header['limit']} (tenant {header['tenant']}, reason "
                 f"{header['reason']}, since {header['since']})")
    return lines


def recover(
    tenant: Annotated[str, typer.Option("--tenant", help="The one tenant whose items to retry.")],
    reason: Annotated[str, typer.Option(
        "--reason", help="The blocked reason, whole (`http_401:INVALID_AUTHENTICATION`) or "
                         "its code before the colon (`http_401`).")],
    since: Annotated[str, typer.Option(
        "--since", help="Blocked at or after: a span back from now (90m, 24h) or an ISO time.")],
    limit: Annotated[int, typer.Option(
        "--limit", help=f"Retry at most this many (1-{MAX_LIMIT}), oldest first.")],
    dry_run: DryRunOpt = False,
    rate: Annotated[float, typer.Option(
        "--rate", help=f"Retries started a second, at most {MAX_RATE:g}.")] = DEFAULT_RATE,
    include_ambiguous: Annotated[bool, typer.Option(
        "--include-ambiguous", help="Also retry ambiguous items (a send may go out twice: "
                                    "check the destination first).")] = False,
    reviewer: Annotated[str, typer.Option(
        "--reviewer", help="A display label; the audit records the authenticated decider "
                           "(INBOXCRM_REVIEWER_TOKEN, else the operator).")] = "recover",
    note: Annotated[str | None, typer.Option(
        "--note", help="Recorded with every retry (default: the selection).")] = None,
    yes: YesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Retry one tenant's items blocked with one reason since a time: show, approve once, run
    at a bounded rate; every retry keeps its operation key."""
    from inboxcrm.store import items as store_items

    validate(limit=limit, rate=rate)
    moment: datetime = parse_since(since)
    states = ["blocked", "ambiguous"]
    settings = settings_from_env()
    rows = with_db(settings, lambda conn: store_items.recovery_candidates(
        conn, tenant=tenant, states=states, reason=reason, since=moment,
        limit=MAX_LIMIT * 2))
    chosen = plan(rows, limit=limit, include_ambiguous=include_ambiguous)
    header = {"tenant": tenant, "reason": reason, "since": moment.isoformat(), "limit": limit,
              "rate": rate, "dry_run": dry_run}

    def report(ran: bool) -> None:
        if as_json:
            out.print_json(json.dumps({**header, "ran": ran, "over_limit": chosen.over_limit,
                                       "items": [asdict(i) for i in chosen.selected],
                                       "refused": [asdict(i) for i in chosen.refused]}))
            return
        for line in render_text(chosen, header, ran=ran):
            out.print(line, highlight=False, markup=False, soft_wrap=True)

    if chosen.refused and not as_json:
        progress(f"{len(chosen.refused)} matching item(s) will not be retried in bulk; see "
                 "why below")
    if dry_run or not chosen.selected:
        report(ran=False)
        return
    if not as_json:
        report(ran=False)  # what each would do, before the one approval
    confirm(f"Retry {len(chosen.selected)} item(s) of {tenant} ({reason}) at {rate:g}/s, "
            "each with its operation key unchanged?", yes)
    note = note or f"bulk recovery: {reason} since {moment.isoformat()}"
    interval = 1.0 / rate
    started = time.monotonic()
    for index, item in enumerate(chosen.selected):
        wait = started + index * interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        _retry_one(item, reviewer, note)
        if not as_json:
            progress(f"[{index + 1}/{len(chosen.selected)}] {item.workflow_id}: {item.outcome}")
    report(ran=True)
    if any(i.outcome != "accepted" for i in chosen.selected):
        raise typer.Exit(1)
