"""The `report` group: `report rule-change`, the items whose follow-up was planned under an
older version of a rule than the one now in policy (docs/architecture.md §10). After a rule
or its words change, an operator sees what was planned before (and may still go out under
the old words, `template_versions`) and decides per item; the command changes nothing.

An intent stores a derived `rule_version` (a hash of the rule's number and its template's
words, `inboxcrm/domain/templates.py`), so "older" is the rule's own number the stored
version traces back to, with the template reference the intent keeps."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import asyncpg
import typer

from inboxcrm.cli.common import JsonOpt, fail, out, settings_from_env, with_db
from inboxcrm.domain.templates import planned_rule_number

report_app = typer.Typer(no_args_is_help=True, help="Read-only reports for operators.")

MAX_VERSION = 10_000  # the rule numbers tried per stored version: bounded work
MAX_LIMIT = 100_000


@dataclass
class PlannedVersion:
    """One stored version of the rule: the rule number it derives from (None: `--version`
    or later), its words, how many intents, and whether it is older than `--version`."""

    version: int | None
    rule_version: int
    template: str
    items: int
    older: bool
    first_planned: str
    last_planned: str


@dataclass
class PlannedItem:
    workflow_id: str
    tenant: str
    state: str
    intent_status: str
    planned_version: int | None
    rule_version: int
    template: str
    planned_at: str


def _iso(value: Any) -> str:
    return value.astimezone(UTC).isoformat() if isinstance(value, datetime) else str(value)


def classify(rows: list[dict[str, Any]], *, rule_id: str, version: int) -> list[PlannedVersion]:
    """The stored versions (`intents.RULE_VERSIONS` rows), each traced to its rule number.
    Pure: the fast tests call it on rows as the store returns them."""
    found = []
    for row in rows:
        number = planned_rule_number(rule_id, row["rule_version"], row["template_id"],
                                     below=version)
        found.append(PlannedVersion(
            version=number, rule_version=row["rule_version"], template=row["template_id"],
            items=int(row["items"]), older=number is not None,
            first_planned=_iso(row["first_planned"]), last_planned=_iso(row["last_planned"])))
    return found


def planned_items(rows: list[dict[str, Any]], versions: list[PlannedVersion]
                  ) -> list[PlannedItem]:
    numbers = {v.rule_version: v.version for v in versions}
    return [PlannedItem(
        workflow_id=row["workflow_id"], tenant=row["tenant"], state=row["state"],
        intent_status=row["intent_status"], planned_version=numbers.get(row["rule_version"]),
        rule_version=row["rule_version"], template=row["template_id"],
        planned_at=_iso(row["planned_at"])) for row in rows]


def render_text(header: dict[str, Any], versions: list[PlannedVersion],
                items: list[PlannedItem]) -> list[str]:
    """The lines a person reads: one per item planned under an older version, then the
    counts per planned version (older ones and the rest) and a summary."""
    lines = [f"{i.workflow_id}  {i.state}  intent {i.intent_status}  planned v"
             f"{i.planned_version} ({i.template})  at {i.planned_at}" for i in items]
    for v in versions:
        label = f"v{v.version}" if v.version is not None else f"v{header['version']} or later"
        lines.append(f"{label} ({v.template}, stored {v.rule_version}): {v.items} item(s)"
                     f"{' older' if v.older else ''}, planned {v.first_planned} .. "
                     f"{v.last_planned}")
    older = sum(v.items for v in versions if v.older)
    statuses = Counter(i.intent_status for i in items)
    by_status = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "none"
    shown = f"; {len(items)} shown (--limit {header['limit']})" if len(items) < older else ""
    lines.append(f"{older} item(s) of rule {header['rule']} planned under a version older than "
                 f"v{header['version']} (tenant {header['tenant'] or 'all'}; intents: "
                 f"{by_status}){shown}")
    return lines


def rule_change(
    rule: Annotated[str, typer.Option("--rule", help="The follow-up rule's `rule_id`.")],
    version: Annotated[int, typer.Option(
        "--version", help="The rule's `version` now in policy: items planned under a lower "
                          "number are listed.")],
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant.")] = None,
    limit: Annotated[int, typer.Option(
        "--limit", help=f"List at most this many items, oldest plan first (1-{MAX_LIMIT}); "
                        "the counts are always complete.")] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Items whose follow-up was planned under an older version of a rule; changes nothing."""
    from inboxcrm.store import intents
    from inboxcrm.store.items import record_dict

    if not 1 <= version <= MAX_VERSION:
        fail(f"--version must be between 1 and {MAX_VERSION}", 2)
    if not 1 <= limit <= MAX_LIMIT:
        fail(f"--limit must be between 1 and {MAX_LIMIT}", 2)
    settings = settings_from_env()

    async def load(conn: asyncpg.Connection[Any]
                   ) -> tuple[list[PlannedVersion], list[PlannedItem]]:
        groups = [record_dict(r) for r in await intents.rule_versions(
            conn, rule_id=rule, tenant=tenant)]
        versions = classify(groups, rule_id=rule, version=version)
        older = [v.rule_version for v in versions if v.older]
        rows = [record_dict(r) for r in await intents.items_under_versions(
            conn, rule_id=rule, tenant=tenant, rule_versions=older, limit=limit)] if older else []
        return versions, planned_items(rows, versions)

    versions, items = with_db(settings, load)
    header = {"rule": rule, "version": version, "tenant": tenant, "limit": limit}
    if as_json:
        out.print_json(json.dumps({
            **header, "older_items": sum(v.items for v in versions if v.older),
            "versions": [asdict(v) for v in versions], "items": [asdict(i) for i in items]}))
        return
    for line in render_text(header, versions, items):
        out.print(line, highlight=False, markup=False, soft_wrap=True)


report_app.command("rule-change")(rule_change)
