"""`inboxcrm crm check --tenant T`: the CRM's side of the no-duplicates guarantee, checked
before a tenant goes live (docs/architecture.md §5): the external ID field our writes are
keyed by exists, is unique and is an external ID, read from the CRM's own field definitions
(Salesforce describe, HubSpot property definitions). The worker runs the same check at start
and does not take a tenant live that fails it."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from inboxcrm.adapters.base import AdapterError, CrmGuarantee, GuaranteeCheck
from inboxcrm.adapters.factory import ConfigurationError, Destinations
from inboxcrm.cli.common import JsonOpt, fail, out, settings_from_env
from inboxcrm.domain.policy import PolicyError, UnknownTenant, get_policy

crm_app = typer.Typer(no_args_is_help=True, help="The tenant's CRM: checks before going live.")


async def _check(tenant: str) -> tuple[str, tuple[GuaranteeCheck, ...] | None]:
    settings = settings_from_env()
    destinations = Destinations(settings, lambda name: get_policy(name).destinations)
    try:
        crm = destinations.crm(tenant)
        if not isinstance(crm, CrmGuarantee):
            return crm.name, None
        return crm.name, await destinations.check_guarantees(tenant)
    finally:
        await destinations.aclose()


@crm_app.command("check")
def check(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant whose CRM to check.")],
    as_json: JsonOpt = False,
) -> None:
    """Check that the tenant's CRM can hold the guarantee: the external ID field exists, is
    unique and is an external ID (exit 1 naming the field and what to do when not)."""
    try:
        get_policy(tenant)
        provider, checks = asyncio.run(_check(tenant))
    except UnknownTenant:
        fail(f"unknown tenant {tenant!r}: no policy file for it")
        return
    except (PolicyError, ConfigurationError) as exc:
        fail(str(exc))
        return
    except AdapterError as exc:
        fail(f"the CRM could not be asked ({exc}); nothing was checked")
        return
    if checks is None:
        fail(f"provider {provider!r} cannot be checked (it offers no field definitions)")
        return
    ok = all(c.ok for c in checks)
    if as_json:
        out.print_json(json.dumps({
            "tenant": tenant, "provider": provider, "ok": ok,
            "checks": [{"object": c.object, "field": c.field, "ok": c.ok,
                        "problem": c.problem} for c in checks]}))
    else:
        for c in checks:
            if c.ok:
                out.print(f"ok: {provider} {c.object}.{c.field} exists, unique, external ID",
                          highlight=False, markup=False)
            else:
                out.print(f"refused: {c.problem}", highlight=False, markup=False,
                          soft_wrap=True)
    if not ok:
        raise typer.Exit(1)
