"""`inboxcrm contact link --tenant T ADDRESS_A ADDRESS_B`: a person who changed address (or
writes from two) is one identity (docs/architecture.md §5, "Changes of address and
merges"). The second address is linked to the contact of the first (migration 077), audited
(`contact_linked`), and from then on mail from either reaches the one contact and its one CRM
record. Two contacts that both have CRM records are refused: merge them in the CRM first.
The joined contact's open items whose CRM upsert has not been done move to the kept contact
(`items_moved`); the others stay (`items_kept`)."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer

from inboxcrm.cli.common import JsonOpt, fail, out, settings_from_env, with_db
from inboxcrm.domain.policy import (
    InvalidAddress,
    PolicyError,
    UnknownTenant,
    canonical_email,
    get_policy,
)
from inboxcrm.operator.reviewer_auth import NotAuthorised, cli_principal
from inboxcrm.store import contact_links

contact_app = typer.Typer(no_args_is_help=True,
                          help="Contacts: join two addresses of one person.")


@contact_app.command("link")
def link(
    address_a: Annotated[str, typer.Argument(help="The address whose contact is kept.")],
    address_b: Annotated[str, typer.Argument(help="The person's other address.")],
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant of both addresses.")],
    reviewer: Annotated[str | None, typer.Option(
        "--reviewer", help="A label for who decided the two are one person (the audit's "
                           "actor is who authenticated).")] = None,
    note: Annotated[str | None, typer.Option(
        "--note", help="Why (kept in the audit entry; no message text).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Join ADDRESS_B to the contact of ADDRESS_A (or A to B's, when only B has one): mail from
    either then reaches one contact and one CRM record. Safe to repeat."""
    try:
        policy = get_policy(tenant)
        first, second = canonical_email(address_a, policy), canonical_email(address_b, policy)
    except UnknownTenant:
        fail(f"unknown tenant {tenant!r}: no policy file for it")
        return
    except InvalidAddress as exc:
        fail(str(exc))
        return
    except PolicyError as exc:
        fail(str(exc))
        return
    settings = settings_from_env()

    async def run(conn: Any) -> contact_links.Linked:
        # As the review commands: the reviewer of INBOXCRM_REVIEWER_TOKEN (their tenants
        # only), else the operator; the audit's actor is who authenticated, `--reviewer` a
        # label (docs/architecture.md §6).
        principal = await cli_principal(conn, os.environ, settings)
        if not principal.may_see(tenant):
            raise NotAuthorised(f"not a reviewer of tenant {tenant!r}")
        return await contact_links.link(conn, tenant=tenant, first=first, second=second,
                                        actor=principal.decider, note=note, label=reviewer)

    try:
        linked = with_db(settings, run)
    except NotAuthorised as exc:
        fail(str(exc))
        return
    except contact_links.LinkRefused as exc:
        fail(f"refused: {exc}")
        return
    if as_json:
        out.print_json(json.dumps({
            "tenant": tenant, "contact_id": linked.contact_id,
            "crm_record_id": linked.crm_record_id, "changed": linked.changed,
            "joined_contact_id": linked.joined_contact_id,
            "items_moved": list(linked.items_moved), "items_kept": list(linked.items_kept)}))
        return
    what = "linked" if linked.changed else "already linked"
    out.print(f"{what}: both addresses reach contact {linked.contact_id}"
              + (f" (CRM record {linked.crm_record_id})" if linked.crm_record_id else ""),
              highlight=False, markup=False)
    if linked.items_moved or linked.items_kept:
        out.print(f"open items of the joined contact: {len(linked.items_moved)} moved to it, "
                  f"{len(linked.items_kept)} left where they are (past their CRM step, or "
                  "its outcome not known: see the audit's contact_linked entry)",
                  highlight=False, markup=False)
