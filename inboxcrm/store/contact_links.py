"""The `contact_addresses` table (migration 077): a person's second address linked to the
contact of the first (`inboxcrm contact link`), consulted by the planner before it keys the
contact by address, so mail from either address reaches one contact and one CRM record. A
joined contact's open items not yet past their CRM upsert move to the kept contact with the
link (`_move_items`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inboxcrm.schemas.models import TERMINAL_STATES, Action
from inboxcrm.store import audit

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

# The identity key the planner uses for an address: the linked contact's own address when the
# address is linked (a forgotten contact's address is never answered: it is no key any more).
LINKED_IDENTITY = """
SELECT c.canonical_email FROM contact_addresses a JOIN contacts c USING (contact_id)
WHERE a.tenant = $1 AND a.canonical_email = $2 AND c.status <> 'forgotten'
"""

# The contact an address reaches in the tenant (its own, else the one it is linked to),
# locked: two links of the same addresses run one after the other.
CONTACT_OF_ADDRESS = """
SELECT c.contact_id, c.canonical_email, c.crm_record_id, c.created_at,
       (c.canonical_email = $2) AS own
FROM contacts c
WHERE c.tenant = $1 AND c.status <> 'forgotten'
  AND (c.canonical_email = $2 OR c.contact_id = (
       SELECT contact_id FROM contact_addresses WHERE tenant = $1 AND canonical_email = $2))
ORDER BY own DESC
LIMIT 1
FOR UPDATE OF c
"""

# Whether another tenant holds the address (a contact or a link), the tenant itself not.
OTHER_TENANT_HOLDS = """
SELECT EXISTS (SELECT 1 FROM contacts WHERE canonical_email = $2 AND tenant <> $1)
    OR EXISTS (SELECT 1 FROM contact_addresses WHERE canonical_email = $2 AND tenant <> $1)
"""

# The suppressions (any scope) of the two addresses. $1 tenant, $2 both addresses.
SUPPRESSED = """
SELECT canonical_email, scope FROM suppressions WHERE tenant = $1 AND canonical_email = ANY($2)
"""

# $1 tenant, $2 the address linked, $3 its contact, $4 who linked it. A repeat keeps the link.
INSERT_LINK = """
INSERT INTO contact_addresses (tenant, canonical_email, contact_id, linked_by)
VALUES ($1, $2, $3, $4)
ON CONFLICT (tenant, canonical_email) DO UPDATE SET contact_id = EXCLUDED.contact_id
RETURNING (xmax = 0) AS inserted
"""

# Links that pointed at a contact now joined to another follow it.
MOVE_LINKS = """
UPDATE contact_addresses SET contact_id = $2 WHERE contact_id = $1
"""


# The joined contact's CRM upserts not yet done, locked (an attempt's start waits for the
# link, then reads the contact it now names). Movable: no attempt may have taken effect (never
# tried, or each try certainly refused: no key window, nothing unknown, none in flight); the
# others may have made a record keyed by the joined contact's ID, which only their own
# reconciliation can find. $1 the joined contact, $2 the action, $3 terminal item states.
OPEN_UPSERTS = """
SELECT o.op_key, o.event_id,
       (o.status NOT IN ('in_progress', 'ambiguous') AND o.key_window_from IS NULL
        AND o.last_error_category IS DISTINCT FROM 'unknown') AS movable
FROM operations o JOIN inbound_events e USING (event_id)
WHERE o.action = $2 AND o.external_ref = $1::text
  AND o.status NOT IN ('completed', 'cancelled') AND NOT (e.state = ANY($3::text[]))
ORDER BY o.op_key
FOR UPDATE OF o
"""

# The joined contact's other open items (past their CRM step, or not yet planned one).
OPEN_ITEMS = """
SELECT event_id FROM inbound_events
WHERE contact_id = $1 AND NOT (state = ANY($2::text[])) AND NOT (event_id = ANY($3::uuid[]))
ORDER BY event_id
"""

# An item moved: its CRM upsert names the kept contact, and so does its event (the note and
# the email activities reach the contact's record through it). $1 op keys, $2 the kept contact.
MOVE_UPSERTS = """
UPDATE operations SET external_ref = $2::text WHERE op_key = ANY($1::text[])
"""
MOVE_EVENTS = """
UPDATE inbound_events SET contact_id = $2 WHERE event_id = ANY($1::uuid[])
"""


class LinkRefused(Exception):  # noqa: N818 - an outcome the CLI reports, not a bug
    """The link cannot be made; the message says why and what to do (no address in it)."""


@dataclass(frozen=True)
class Linked:
    contact_id: str
    crm_record_id: str | None
    changed: bool                    # False: the addresses already reached this contact
    joined_contact_id: str | None    # the other address's own contact, now joined (or None)
    items_moved: tuple[str, ...] = ()  # its open items (event IDs) now on the kept contact
    items_kept: tuple[str, ...] = ()   # its open items left where they are (see `_move_items`)


async def linked_identity(conn: Conn, *, tenant: str, canonical_email: str) -> str | None:
    """The identity key of a linked address (its contact's address), None when not linked."""
    value: str | None = await conn.fetchval(LINKED_IDENTITY, tenant, canonical_email)
    return value


async def link(conn: Conn, *, tenant: str, first: str, second: str, actor: str,
               note: str | None, label: str | None = None) -> Linked:
    """Join `second` to the contact `first` reaches (or the other way round when only the
    second has one; the contact that has a CRM record wins, else the older). Two contacts that
    both have CRM records are refused: the CRM holds two records for the person, and which
    survives is the CRM's merge to make. Run in one transaction with the audit entry."""
    if first == second:
        raise LinkRefused("the two addresses are the same identity under the tenant's policy")
    async with conn.transaction():
        for address in (first, second):
            if await conn.fetchval(OTHER_TENANT_HOLDS, tenant, address) and \
                    await conn.fetchrow(CONTACT_OF_ADDRESS, tenant, address) is None:
                raise LinkRefused("an address belongs to another tenant; a link joins two "
                                  "addresses of one tenant's person only")
        rows = [await conn.fetchrow(CONTACT_OF_ADDRESS, tenant, a) for a in (first, second)]
        refuse_unequal_consent(
            {r["canonical_email"]: r["scope"] for r in await conn.fetch(
                SUPPRESSED, tenant, [first, second, *(r["canonical_email"] for r in rows if r)])},
            [first, second, *(r["canonical_email"] for r in rows if r)])
        keep, other, alias = _choose(rows, first, second)
        changed = False
        joined: str | None = None
        moved: tuple[str, ...] = ()
        kept: tuple[str, ...] = ()
        if other is not None and other["contact_id"] != keep["contact_id"]:
            joined = str(other["contact_id"])
            await conn.execute(MOVE_LINKS, other["contact_id"], keep["contact_id"])
            moved, kept = await _move_items(conn, joined=other["contact_id"],
                                            kept=keep["contact_id"])
            changed = True
        if alias != keep["canonical_email"]:
            inserted = await conn.fetchval(INSERT_LINK, tenant, alias, keep["contact_id"], actor)
            changed = changed or bool(inserted)
        if changed:
            await audit.append(
                conn, tenant=tenant, event_id=None, workflow_id=None,
                contact_id=str(keep["contact_id"]), actor=actor, action="contact_linked",
                detail={"contact_id": str(keep["contact_id"]), "joined_contact_id": joined,
                        "crm_record_id": keep["crm_record_id"], "note": note,
                        "typed_reviewer": label, "items_moved": list(moved),
                        "items_kept": list(kept)})
    return Linked(str(keep["contact_id"]), keep["crm_record_id"], changed, joined, moved, kept)


async def _move_items(conn: Conn, *, joined: Any, kept: Any) -> tuple[tuple[str, ...],
                                                                         tuple[str, ...]]:
    """The joined contact's open items whose CRM upsert no attempt may have done move to the
    kept contact, so they reach its one record; the rest stay (an upsert that may have
    created a record by the joined contact's ID reconciles by that ID, which a move would
    lose; an item past its CRM step already wrote where it wrote). (moved, kept) event IDs."""
    terminal = sorted(TERMINAL_STATES)
    rows = await conn.fetch(OPEN_UPSERTS, str(joined), Action.CRM_UPSERT.value, terminal)
    movable = [r for r in rows if r["movable"]]
    if movable:
        await conn.execute(MOVE_UPSERTS, [r["op_key"] for r in movable], str(kept))
        await conn.execute(MOVE_EVENTS, [r["event_id"] for r in movable], kept)
    moved = [r["event_id"] for r in movable]
    stay = await conn.fetch(OPEN_ITEMS, joined, terminal, moved)
    return tuple(str(e) for e in moved), tuple(str(r["event_id"]) for r in stay)


def refuse_unequal_consent(suppressed: dict[str, str], addresses: list[str]) -> None:
    """Planning and the send read suppressions by the contact's own address: a link between
    an address that opted out and one that did not (or in another scope) would let mail go
    out under the other, so it is refused until both say the same."""
    if len({suppressed.get(a) for a in addresses}) > 1:
        raise LinkRefused("one address has opted out (or is suppressed in another scope) and "
                          "the other has not: record the same opt-out for both first, then "
                          "link")


def _choose(rows: list[Any], first: str, second: str) -> tuple[Any, Any, str]:
    """(the contact kept, the other contact or None, the address linked to the kept one)."""
    a, b = rows
    if a is None and b is None:
        raise LinkRefused("neither address has a contact yet; link once mail from one of "
                          "them has been handled")
    if a is not None and b is not None and a["contact_id"] != b["contact_id"]:
        if a["crm_record_id"] and b["crm_record_id"] and a["crm_record_id"] != b["crm_record_id"]:
            raise LinkRefused("both addresses have contacts with CRM records of their own: "
                              "merge the two records in the CRM first (the merge is "
                              "followed), then link")
        if b["crm_record_id"] and not a["crm_record_id"] or (
                not a["crm_record_id"] and not b["crm_record_id"]
                and b["created_at"] < a["created_at"]):
            return b, a, a["canonical_email"]
        return a, b, b["canonical_email"]
    if a is None:
        return b, None, first
    if b is None:
        return a, None, second
    return a, None, second if a["canonical_email"] == first else first
