"""One-shot deployment job: apply the database migrations, register the Temporal search
attributes and the Schedules (the drift check, the review notices) before (a new version of)
the workers and relays start.

    python deploy/bootstrap.py [--skip-search-attributes] [--skip-namespaces]
                               [--migrations-only]

In Kubernetes it is the init container of every worker pod (and, with --migrations-only, of
every relay pod, which must not wait for Temporal): each release's pods bring the store and
Temporal to what their code needs before they start, with nothing to delete between releases.
Safe to run repeatedly and concurrently: migrations run under an advisory lock and are
recorded once each; registration adds only missing attribute names; the Schedule is created
once and afterwards brought to the current INBOXCRM_DRIFT_CHECK_* settings. Settings come
from the usual environment (DATABASE_URL, TEMPORAL_ADDRESS, INBOXCRM_*). On Temporal Cloud,
create the search attributes with `tcld namespace search-attributes add` (or the Cloud UI)
and pass --skip-search-attributes (the Schedule is still registered).

With INBOXCRM_TENANT_NAMESPACES (one namespace per tenant, docs/architecture.md §7) it also
registers each tenant's namespace that does not exist (RegisterNamespace) and the search
attributes in it; the Schedules stay in the shared namespace (they cover every tenant). On
Temporal Cloud create the namespaces with `tcld namespace create` and pass --skip-namespaces
together with --skip-search-attributes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from inboxcrm.domain.policy import current_policies
from inboxcrm.platform import temporal
from inboxcrm.platform.config import get_settings
from inboxcrm.store.migrate import apply_migrations


async def bootstrap(skip_search_attributes: bool, migrations_only: bool = False,
                    skip_namespaces: bool = False) -> None:
    settings = get_settings()
    applied = await apply_migrations(settings.database_url, roles=settings.db_role)
    print(f"migrations applied now: {', '.join(applied) or 'none (up to date)'}")  # noqa: T201
    if migrations_only:
        return
    mapping = temporal.tenant_namespaces(settings)
    tenants = sorted(current_policies())
    mapping.check(tenants)  # a bad INBOXCRM_TENANT_NAMESPACES fails the job, not the pods
    client = await temporal.connect(settings)
    if not skip_search_attributes:
        added = await temporal.ensure_search_attributes(client, client.namespace)
        print(f"search attributes added: {', '.join(added) or 'none (all present)'}")  # noqa: T201
    own = mapping.served(tenants)[1:]
    if own and not skip_namespaces:
        registered = await temporal.ensure_namespaces(client, own)
        print(f"tenant namespaces registered: {', '.join(registered) or 'none (all exist)'}"  # noqa: T201
              f" of {', '.join(own)}")
    for schedule_id, outcome in (await temporal.ensure_schedules(client, settings)).items():
        print(f"schedule {schedule_id}: {outcome}")  # noqa: T201


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-search-attributes", action="store_true")
    parser.add_argument("--skip-namespaces", action="store_true",
                        help="the tenants' namespaces exist already (Temporal Cloud: tcld)")
    parser.add_argument("--migrations-only", action="store_true",
                        help="the database only (the relay's init container)")
    args = parser.parse_args()
    try:
        asyncio.run(bootstrap(args.skip_search_attributes, args.migrations_only,
                              args.skip_namespaces))
    except Exception as exc:  # noqa: BLE001 - one line for the job log, exit non-zero
        print(f"bootstrap failed: {type(exc).__name__}: {exc}", file=sys.stderr)  # noqa: T201
        sys.exit(1)


if __name__ == "__main__":
    main()
