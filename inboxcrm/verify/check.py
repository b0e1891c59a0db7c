"""The invariant checker (`inboxcrm check`): proves, from PostgreSQL and the destination,
the promises of docs/architecture.md — nothing duplicated, nothing lost, nothing stuck
without an owner, every retry bounded.

It reads the sandbox's whole state; the scheduled drift check (`inboxcrm/activities/drift.py`) asks
any destination through its adapter. Both judge a stored record with the same verdicts
(`inboxcrm.store.drift`).

Each check names what it examined and lists the IDs that violate it (workflow IDs, contact
IDs, CRM record IDs, email IDs, operation keys, intent IDs) — never an address or a body.
Without a destination URL the destination checks are skipped, and the report says so.

`scope` (a workflow ID prefix, e.g. `inbound/acme/`) restricts every check to those items
and to the contacts, intents, operations and destination records that belong to them, so a
check can run on a shared store without being confused by other people's rows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx

from inboxcrm.store import invariants
from inboxcrm.store.drift import crm_record_drift, email_drift

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

TERMINAL_STATES = frozenset({"completed", "ignored", "suppressed", "rejected", "shadowed"})
REVIEW_STATES = frozenset({"awaiting_review", "blocked", "ambiguous", "held"})
# Waiting for a person too: a run that ended without settling its item (`inboxcrm replay`).
OWNED_STATES = REVIEW_STATES | {"failed"}
IN_FLIGHT_STATES = frozenset({"received", "extracting", "matching", "crm_pending",
                              "send_pending"})
UNOWNED = frozenset({"", "unassigned"})
MAX_IDS = 50  # per check in the printed/JSON report; the count is always complete


class CheckError(RuntimeError):
    """The checker could not read what it needs (database or destination)."""


@dataclass
class CheckResult:
    name: str
    description: str
    examined: int = 0
    violations: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def flag(self, ids: str | Iterable[str]) -> None:
        for item in [ids] if isinstance(ids, str) else ids:
            if item not in self.violations:
                self.violations.append(item)

    def to_json(self, max_ids: int | None = MAX_IDS) -> dict[str, Any]:
        ids = sorted(self.violations)
        return {"name": self.name, "description": self.description, "examined": self.examined,
                "violations": len(ids), "ids": ids if max_ids is None else ids[:max_ids],
                "skipped": self.skipped, "ok": self.ok}


@dataclass
class CheckReport:
    results: list[CheckResult]
    settled: bool
    scope: str | None
    destination: str | None          # None: destination checks skipped
    destination_note: str
    in_flight: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return sum(len(r.violations) for r in self.results)

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def result(self, name: str) -> CheckResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def to_json(self, max_ids: int | None = MAX_IDS) -> dict[str, Any]:
        in_flight = sorted(self.in_flight)
        return {
            "ok": self.ok,
            "violations": self.violations,
            "settled": self.settled,
            "scope": self.scope,
            "destination": {"checked": self.destination is not None,
                            "note": self.destination_note},
            "in_flight": {"count": len(in_flight),
                          "ids": in_flight if max_ids is None else in_flight[:max_ids]},
            "checks": [r.to_json(max_ids) for r in self.results],
        }


# --- the checker -------------------------------------------------------------------------
async def check_invariants(conn: asyncpg.Pool | Conn, sandbox_url: str | None, *,
                           settled: bool = False,
                           scope: str | None = None,
                           crm_id_property: str = "inboxcrm_contact_id",
                           note_id_property: str = "inboxcrm_note_id",
                           note_actions: tuple[str, ...] = ("crm-note",),
                           http: httpx.AsyncClient | None = None) -> CheckReport:
    """Run every check. `conn` is an asyncpg connection or pool. `settled`: items still in
    flight count as violations (use it once the system is known to be quiet).
    `note_actions`: the operations whose side effect is a CRM note (Pipedrive logs the
    conversation's emails as notes too; HubSpot as email engagements).

    The store is read in one repeatable-read snapshot, *then* the destination: whatever the
    store says exists (a record ID, a sent intent) was written at the destination before, so
    a busy system never produces a false "missing"."""
    if hasattr(conn, "acquire"):
        async with conn.acquire() as connection:
            rows = await invariants.read_store(connection, scope)
    else:
        rows = await invariants.read_store(conn, scope)
    events, contacts, intents, operations, suppressions, duplicates = rows
    destination = await _destination_state(sandbox_url, http) if sandbox_url else None
    note = ("destination checks ran against the sandbox" if destination is not None
            else "no sandbox URL: destination checks skipped")

    report = CheckReport([], settled, scope, sandbox_url if destination is not None else None,
                         note)
    report.results.append(_ledger(events, duplicates))
    report.results.append(_identities(contacts))
    scoped = scope is not None
    report.results.append(_crm_records(contacts, destination, crm_id_property, scoped))
    report.results.append(
        await _emails_per_intent(conn, contacts, intents, operations, destination, scoped))
    report.results.append(_sent_intents_confirmed(intents, destination))
    report.results.append(_notes(contacts, operations, destination, note_id_property,
                                 note_actions))
    report.results.append(_suppression(contacts, intents, suppressions, destination))
    accounted, in_flight = _accounted(events, settled)
    report.results.append(accounted)
    report.in_flight = in_flight
    report.results.append(_review_queue(events))
    report.results.append(_completed_operations(events, operations, intents))
    report.results.append(_attempts(operations))
    return report


async def _destination_state(url: str, http: httpx.AsyncClient | None) -> dict[str, Any]:
    client = http or httpx.AsyncClient(timeout=30)
    try:
        response = await client.get(f"{url.rstrip('/')}/_sandbox/state")
        response.raise_for_status()
        state = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise CheckError(f"cannot read the destination state at {url} "
                         f"({type(exc).__name__}); is the sandbox up? "
                         "(or skip destination checks)") from None
    finally:
        if http is None:
            await client.aclose()
    if not isinstance(state, dict):
        raise CheckError("the destination state is not a JSON object")
    found = {"contacts": list(state.get("contacts") or []),
             "emails": list(state.get("emails") or [])}
    if "notes" in state:
        found["notes"] = list(state.get("notes") or [])
    return found


def _skip(result: CheckResult, destination: dict[str, Any] | None) -> bool:
    if destination is None:
        result.skipped = "no destination"
        return True
    return False


def _ledger(events: list[Any], duplicates: list[Any]) -> CheckResult:
    result = CheckResult("one_ledger_row_per_delivery",
                         "no duplicate (tenant, source, mailbox, delivery_id) nor workflow_id",
                         examined=len(events))
    result.flag(r["workflow_id"] for r in duplicates)
    return result


def _identities(contacts: list[Any]) -> CheckResult:
    result = CheckResult("one_contact_per_identity",
                         "one contact per (tenant, canonical_email)", examined=len(contacts))
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for c in contacts:
        groups[(c["tenant"], c["identity"])].append(c["contact_id"])
    for ids in groups.values():
        if len(ids) > 1:
            result.flag(f"contact:{cid}" for cid in ids)
    return result


def _crm_records(contacts: list[Any], destination: dict[str, Any] | None,
                 id_property: str, scoped: bool) -> CheckResult:
    result = CheckResult("one_crm_record_per_contact",
                         f"at most one CRM record per {id_property} and per email; every "
                         "stored crm_record_id exists and belongs to its contact",
                         examined=len(contacts))
    if _skip(result, destination):
        return result
    assert destination is not None
    contact_ids = {c["contact_id"] for c in contacts}
    emails = {c["email"] for c in contacts}
    records = destination["contacts"]
    by_id: dict[str, dict[str, Any]] = {str(r.get("id")): r for r in records}
    by_owner: dict[str, list[str]] = defaultdict(list)
    by_email: dict[str, list[str]] = defaultdict(list)
    for record in records:
        props = record.get("properties") or {}
        owner = str(props.get(id_property) or "")
        email = str(props.get("email") or "").lower()
        if scoped and owner not in contact_ids and email not in emails:
            continue
        if owner:
            by_owner[owner].append(str(record.get("id")))
        if email:
            by_email[email].append(str(record.get("id")))
    for owner, ids in by_owner.items():
        if len(ids) > 1:
            result.flag(f"contact:{owner} records:{','.join(sorted(ids))}")
    for ids in by_email.values():
        if len(ids) > 1:
            result.flag(f"records_same_email:{','.join(sorted(ids))}")
    for c in contacts:
        record_id = c["crm_record_id"]
        if not record_id:
            continue
        record = by_id.get(str(record_id))
        owner = str(((record or {}).get("properties") or {}).get(id_property) or "")
        finding = crm_record_drift(c["contact_id"], str(record_id), exists=record is not None,
                                   owner=owner or None)
        if finding is not None:
            result.flag([f"{finding.subject} {finding.detail}"])
    return result


async def _emails_per_intent(conn: asyncpg.Pool | Conn, contacts: list[Any], intents: list[Any],
                             operations: list[Any], destination: dict[str, Any] | None,
                             scoped: bool) -> CheckResult:
    result = CheckResult("one_email_per_intent",
                         "at most one email per follow-up intent (idempotency key), no email "
                         "with a key unknown to us, one send operation per intent "
                         "(examined: emails, else intents)",
                         examined=len(intents))
    sends: dict[str, list[str]] = defaultdict(list)
    for op in operations:
        if op["action"] == "send" and op["external_ref"]:
            sends[op["external_ref"]].append(op["op_key"])
    for keys in sends.values():
        if len(keys) > 1:
            result.flag(keys)
    if destination is None:
        result.skipped = "destination part skipped (no destination)"
        return result
    intent_ids = {i["intent_id"] for i in intents}
    emails = {c["email"] for c in contacts}
    selected = [m for m in destination["emails"]
                if not scoped or m.get("idempotency_key") in intent_ids
                or any(str(t).lower() in emails for t in m.get("to") or [])]
    keys = [str(m["idempotency_key"]) for m in selected if m.get("idempotency_key")]
    known = await invariants.known_intents(conn, keys) if keys else set()
    by_key: dict[str, list[str]] = defaultdict(list)
    for message in selected:
        key = message.get("idempotency_key")
        if not key or str(key) not in known:
            result.flag([f"email:{message.get('id')} unknown_key"])
            continue
        by_key[str(key)].append(str(message.get("id")))
    for key, ids in by_key.items():
        if len(ids) > 1:
            result.flag(f"intent:{key} email:{email_id}" for email_id in sorted(ids))
    result.examined = len(selected)
    return result


def _notes(contacts: list[Any], operations: list[Any], destination: dict[str, Any] | None,
           id_property: str, note_actions: tuple[str, ...] = ("crm-note",)) -> CheckResult:
    """The inbound email logged on the contact is a side effect of its own (`…:crm-note`):
    at most one note per note key, and no more notes on a contact's CRM record than note
    operations planned for that contact; a completed note operation's note exists."""
    note_ops = [op for op in operations if op["action"] in note_actions]
    result = CheckResult("one_note_per_note_operation",
                         "at most one CRM note per note operation; completed ones exist",
                         examined=len(note_ops))
    if _skip(result, destination):
        return result
    assert destination is not None
    if "notes" not in destination:
        result.skipped = "the destination reports no notes"
        return result
    planned: Counter[str] = Counter(op["contact_id"] for op in note_ops if op["contact_id"])
    records = {str(c["crm_record_id"]): c["contact_id"] for c in contacts if c["crm_record_id"]}
    on_record: dict[str, list[str]] = defaultdict(list)
    by_key: dict[str, list[str]] = defaultdict(list)
    note_ids = set()
    for note in destination["notes"]:
        note_id = str(note.get("id"))
        note_ids.add(note_id)
        associated = [str(r) for r in (note.get("associations") or {}).get("contacts") or []]
        mine = [records[r] for r in associated if r in records]
        if not mine:
            continue
        for contact_id in mine:
            on_record[contact_id].append(note_id)
        key = str((note.get("properties") or {}).get(id_property) or "")
        if key:
            by_key[key].append(note_id)
    for key, ids in by_key.items():
        if len(ids) > 1:
            result.flag(f"note_key:{key} notes:{','.join(sorted(ids))}")
    for contact_id, ids in on_record.items():
        if len(ids) > planned[contact_id]:
            result.flag(f"contact:{contact_id} notes:{len(ids)} planned:{planned[contact_id]}")
    for op in note_ops:
        if op["status"] == "completed" and op["destination_id"] \
                and str(op["destination_id"]) not in note_ids:
            result.flag(f"{op['op_key']} missing_note:{op['destination_id']}")
    return result


def _sent_intents_confirmed(intents: list[Any],
                            destination: dict[str, Any] | None) -> CheckResult:
    result = CheckResult("sent_intents_exist_at_destination",
                         "every intent recorded as sent has its email at the destination",
                         examined=sum(1 for i in intents if i["status"] == "sent"))
    if _skip(result, destination):
        return result
    assert destination is not None
    by_id = {str(m.get("id")): m for m in destination["emails"]}
    keys = {str(m.get("idempotency_key")) for m in destination["emails"]}
    for intent in intents:
        if intent["status"] != "sent":
            continue
        message_id = intent["provider_message_id"]
        email = by_id.get(str(message_id)) if message_id else None
        key = (email or {}).get("idempotency_key")
        drift = message_id and email_drift(intent["intent_id"], str(message_id),
                                           exists=email is not None,
                                           key=str(key) if key else None)
        if intent["intent_id"] not in keys or drift:
            result.flag([f"intent:{intent['intent_id']}"])
    return result


def _suppression(contacts: list[Any], intents: list[Any], suppressions: list[Any],
                 destination: dict[str, Any] | None) -> CheckResult:
    """The send time is the destination's own record of the email when we can see it, else
    our `sent_at` (an upper bound: recorded after the provider answered)."""
    by_identity = {(s["tenant"], s["identity"]): s["created_at"] for s in suppressions}
    scoped_identities = {(c["tenant"], c["identity"]) for c in contacts}
    relevant = {k: v for k, v in by_identity.items() if k in scoped_identities}
    result = CheckResult("no_email_after_suppression",
                         "no follow-up sent to a suppressed identity after its suppression",
                         examined=len(relevant))
    at_destination: set[str] = set()
    if destination is not None:
        owners: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for c in contacts:
            owners[c["email"]].append((c["tenant"], c["identity"]))
        for message in destination["emails"]:
            if message.get("idempotency_key"):
                at_destination.add(str(message["idempotency_key"]))
            created = _parse_time(message.get("created_at"))
            for to in message.get("to") or []:
                for owner in owners.get(str(to).lower(), []):
                    suppressed_at = relevant.get(owner)
                    if suppressed_at is not None and created is not None \
                            and created > suppressed_at:
                        result.flag([f"email:{message.get('id')}"])
    for intent in intents:
        suppressed_at = relevant.get((intent["tenant"], intent["identity"]))
        if suppressed_at is None or intent["intent_id"] in at_destination:
            continue  # the destination's own record of the send was judged above
        if intent["sent_at"] is not None and intent["sent_at"] > suppressed_at:
            result.flag([f"intent:{intent['intent_id']}"])
    return result


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _accounted(events: list[Any], settled: bool) -> tuple[CheckResult, list[str]]:
    result = CheckResult("every_item_terminal_or_owned",
                         "every item terminal, or in review (or failed) with an open owned task"
                         + ("; nothing in flight (settled)" if settled else
                            "; in-flight items reported, not counted"),
                         examined=len(events))
    in_flight: list[str] = []
    for event in events:
        state, workflow_id = event["state"], event["workflow_id"]
        if state in TERMINAL_STATES:
            continue
        if state in OWNED_STATES:
            owner = event["open_task_owner"]
            if owner is None or str(owner).strip() in UNOWNED:
                result.flag([f"{workflow_id} state:{state} no_owned_task"])
            continue
        if state in IN_FLIGHT_STATES:
            in_flight.append(workflow_id)
            if settled:
                result.flag([f"{workflow_id} state:{state} in_flight"])
            continue
        result.flag([f"{workflow_id} state:{state}"])
    return result, in_flight


def _review_queue(events: list[Any]) -> CheckResult:
    result = CheckResult("no_open_task_on_terminal_item",
                         "the review queue holds no finished item", examined=len(events))
    for event in events:
        if event["state"] in TERMINAL_STATES and event["open_task_owner"] is not None:
            result.flag([f"{event['workflow_id']} state:{event['state']} open_task"])
    return result


# Finished without a person: nothing of theirs may be left unsettled. (A rejected item's
# operations stay as the reviewer found them: the rejection is the decision.)
FINISHED_STATES = ("completed", "suppressed", "ignored")


def _completed_operations(events: list[Any], operations: list[Any],
                          intents: list[Any]) -> CheckResult:
    """An item reported `suppressed` with its send still in progress would hide an email
    that may have gone out (a re-planned item did, before plans were kept on re-runs). The
    unconfirmed send a person sent again (`send_again`, a later intent repeats its intent)
    stays as it was: it is the evidence, settled by the repeat."""
    finished = {e["workflow_id"] for e in events if e["state"] in FINISHED_STATES}
    repeated = {i["repeats_intent_id"] for i in intents if i["repeats_intent_id"]}
    result = CheckResult("finished_items_have_settled_operations",
                         "a completed, suppressed or ignored item has no operation left "
                         "pending, failed or in progress", examined=len(finished))
    for op in operations:
        if op["action"] == "send" and op["external_ref"] in repeated:
            continue
        if op["workflow_id"] in finished and op["status"] not in ("completed", "cancelled"):
            result.flag([f"{op['op_key']} status:{op['status']}"])
    return result


def _attempts(operations: list[Any]) -> CheckResult:
    result = CheckResult("attempts_within_budget", "every operation's attempts <= max_attempts",
                         examined=len(operations))
    result.flag(f"{op['op_key']} attempts:{op['attempts']}/{op['max_attempts']}"
                for op in operations if op["attempts"] > op["max_attempts"])
    return result


def summary_rows(report: CheckReport) -> list[tuple[str, str, str, str]]:
    """(check, examined, violations, note) rows for a table."""
    rows = []
    for r in report.results:
        note = r.skipped or ("ok" if r.ok else ", ".join(sorted(r.violations)[:3])
                             + (" …" if len(r.violations) > 3 else ""))
        rows.append((r.name, str(r.examined), str(len(r.violations)), note))
    rows.append(("in_flight" + (" (settled: violation)" if report.settled else ""),
                 "", str(len(report.in_flight)),
                 ", ".join(sorted(report.in_flight)[:3]) if report.in_flight else "none"))
    return rows
