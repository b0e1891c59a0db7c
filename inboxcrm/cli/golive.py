"""`inboxcrm mode` and `inboxcrm shadow report`: taking a tenant live (docs/architecture.md
§6, "Going live"; the names are §10's). Registered on the console script by
`inboxcrm.cli.main` (`register(app)`)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Annotated, Any

import asyncpg
import typer
from rich.table import Table

from inboxcrm.cli.common import JsonOpt, fail, out, parse_since, settings_from_env, with_db
from inboxcrm.domain.policy import PolicyError, TenantPolicy, UnknownTenant, get_policy
from inboxcrm.domain.shadow import describe, summarise
from inboxcrm.store import modes, ramp
from inboxcrm.store import shadow as shadow_store
from inboxcrm.store.items import record_dict

MODES = ("shadow", "live")


def _policy(tenant: str) -> TenantPolicy:
    try:
        return get_policy(tenant)
    except UnknownTenant:
        fail(f"unknown tenant {tenant!r}: no policy file for it")
        raise
    except PolicyError as exc:
        fail(str(exc))
        raise


def _ramp_json(policy: TenantPolicy) -> dict[str, Any] | None:
    return policy.ramp.model_dump() if policy.ramp is not None else None


async def _mode_state(conn: asyncpg.Connection[Any], tenant: str, policy: TenantPolicy
                      ) -> dict[str, Any]:
    """The mode a tenant runs in now, and its ramp (if one is running or would start)."""
    row = await modes.current_mode(conn, tenant)
    mode = str(row["mode"]) if row is not None else policy.mode
    since: datetime | None = row["since"] if row is not None else None
    state: dict[str, Any] = {
        "tenant": tenant, "mode": mode, "since": since.isoformat() if since else None,
        "by": row["by"] if row is not None else None,
        "set_by": "operator" if row is not None else "policy", "ramp": None}
    if policy.ramp is None:
        return state
    ramp_state: dict[str, Any] = {
        "days": policy.ramp.days,
        "max_auto_followups_per_hour": policy.ramp.max_auto_followups_per_hour,
        "status": "starts when switched to live" if mode == "shadow" else "none"}
    if mode == "live" and since is not None and row is not None:
        until = since + timedelta(days=policy.ramp.days)
        held = await shadow_store.ramp_held(conn, tenant, since)
        ramp_state |= {
            "status": "running" if row["now"] < until else "over", "until": until.isoformat(),
            "held_for_review": int(held["held"]), "still_waiting": int(held["waiting"]),
            "hours": [record_dict(r) for r in await ramp.ramp_hours(conn, tenant, since)]}
    state["ramp"] = ramp_state
    return state


def register(app: typer.Typer) -> None:
    """Add `mode` and `shadow report` to the console script."""
    shadow_app = typer.Typer(no_args_is_help=True,
                             help="Shadow mode: what the product would have done.")
    app.add_typer(shadow_app, name="shadow")

    @app.command("mode")
    def mode_command(
        tenant: Annotated[str, typer.Argument(help="The tenant (its policy file's name).")],
        mode: Annotated[str | None, typer.Argument(
            help="shadow: plan every item, write and send nothing. live: carry items out "
                 "(starting the policy's ramp). Omit to show the current mode.")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Show or switch a tenant's mode (recorded in the audit)."""
        if mode is not None and mode not in MODES:
            fail(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        policy = _policy(tenant)
        settings = settings_from_env()
        actor = os.environ.get("USER", "operator")

        async def apply(conn: asyncpg.Connection[Any]) -> dict[str, Any]:
            changed, previous = False, None
            if mode is not None:
                previous, changed = await modes.switch_mode(
                    conn, tenant, mode, actor, policy.mode, _ramp_json(policy))
            return await _mode_state(conn, tenant, policy) | {"changed": changed,
                                                               "previous": previous}

        state = with_db(settings, apply)
        if as_json:
            out.print_json(json.dumps(state))
            return
        if mode is None:
            out.print(f"{tenant}: {state['mode']} (set by {state['set_by']}"
                      + (f" {state['by']} at {state['since']}" if state["since"] else "")
                      + ")", highlight=False)
        elif state["changed"]:
            out.print(f"{tenant}: {state['previous']} → {state['mode']} (recorded in the "
                      "audit)", highlight=False)
        else:
            out.print(f"{tenant}: already {state['mode']}; nothing changed", highlight=False)
        ramp_state = state["ramp"]
        if ramp_state is not None:
            line = (f"ramp: {ramp_state['status']}; at most "
                    f"{ramp_state['max_auto_followups_per_hour']} automatic follow-ups per "
                    f"hour for {ramp_state['days']:g} day(s)")
            if ramp_state.get("until"):
                line += (f" until {ramp_state['until']}; held for a reviewer so far: "
                         f"{ramp_state['held_for_review']}")
            out.print(line, highlight=False)

    @shadow_app.command("report")
    def shadow_report(
        tenant: Annotated[str, typer.Option("--tenant", help="The tenant.")],
        since: Annotated[str | None, typer.Option(
            "--since", help="Only items received since then (ISO 8601, or a span back from "
            "now: 24h, 7d).")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Every item the tenant received in shadow mode, by delivery ID, with what would
        have happened; counts by route and reason, contacts, follow-ups, reviews, the
        second extractor's disagreements; and the ramp of a first live run."""
        policy = _policy(tenant)
        start = parse_since(since) if since is not None else None
        settings = settings_from_env()

        async def load(conn: asyncpg.Connection[Any]) -> dict[str, Any]:
            rows = await shadow_store.items(conn, tenant, start)
            items = []
            for row in rows:
                plan = row["shadow_plan"]
                items.append({
                    "delivery_id": row["delivery_id"], "workflow_id": row["workflow_id"],
                    "source": row["source"], "received_at": row["received_at"].isoformat(),
                    "state": row["state"], "reason": row["reason"], "route": row["route"],
                    "route_reasons": list(row["route_reasons"] or []),
                    "shadow_plan": plan, "would": describe(plan)})
            return {"tenant": tenant, "since": start.isoformat() if start else None,
                    "mode": await _mode_state(conn, tenant, policy),
                    "summary": summarise(items), "items": items}

        report = with_db(settings, load)
        if as_json:
            out.print_json(json.dumps(report))
            return
        _print_report(report)


def _print_report(report: dict[str, Any]) -> None:
    mode, summary = report["mode"], report["summary"]
    out.print(f"[bold]{report['tenant']}[/bold]: {mode['mode']} "
              f"(set by {mode['set_by']}), {summary['items']} item(s) received in shadow "
              f"mode" + (f" since {report['since']}" if report["since"] else ""),
              highlight=False)
    counts = Table(title="what would have happened")
    counts.add_column("")
    counts.add_column("count", justify="right")
    rows: list[tuple[str, Any]] = [
        *((f"route {k}", v) for k, v in summary["by_route"].items()),
        *((f"reason {k}", v) for k, v in summary["by_reason"].items()),
        ("contacts created", summary["contacts"]["would_create"]),
        ("contacts updated", summary["contacts"]["would_update"]),
        ("follow-ups sent", summary["followups"]["would_send"]),
        ("follow-ups awaiting approval", summary["followups"]["would_wait_for_approval"]),
        *((f"no follow-up: {k}", v) for k, v in summary["followups"]["not_sent"].items()),
        *((f"waits for a person: {k}", v)
          for k, v in summary["would_wait_for_a_person"].items()),
        ("not planned yet", summary["not_planned_yet"]),
    ]
    for label, value in rows:
        counts.add_row(label, str(value))
    out.print(counts)
    items = Table(title="items")
    for column in ("delivery_id", "received", "route", "outcome", "would"):
        items.add_column(column)
    for item in report["items"]:
        plan = item["shadow_plan"] or {}
        items.add_row(item["delivery_id"], item["received_at"][:19], str(item["route"]),
                      str(plan.get("outcome", item["state"])), item["would"])
    out.print(items)
    second = summary["second_extractor"]
    if second["compared"] or second["unavailable"]:
        out.print(f"second extractor: compared {second['compared']}, unavailable "
                  f"{second['unavailable']}, routed differently "
                  f"{len(second['routed_differently'])}", highlight=False)
        for diff in second["routed_differently"]:
            out.print(f"  {diff['delivery_id']}: {diff['route']} → {diff['second_route']} "
                      f"({', '.join(diff['second_reasons']) or '-'}; {diff['extractor']})",
                      highlight=False)
    else:
        out.print("second extractor: nothing compared (none configured: INBOXCRM_LLM_*, "
                  "or no message reached it)", highlight=False)
    ramp_state = mode.get("ramp")
    if ramp_state:
        out.print(f"ramp: {ramp_state['status']}, at most "
                  f"{ramp_state['max_auto_followups_per_hour']} automatic follow-ups per hour "
                  f"for {ramp_state['days']:g} day(s)"
                  + (f" until {ramp_state['until']}; held for a reviewer: "
                     f"{ramp_state['held_for_review']} ({ramp_state['still_waiting']} still "
                     "waiting)" if ramp_state.get("until") else ""), highlight=False)
        for hour in ramp_state.get("hours", []):
            out.print(f"  {hour['hour_start']}: granted {hour['granted']}, held "
                      f"{hour['held']}", highlight=False)
