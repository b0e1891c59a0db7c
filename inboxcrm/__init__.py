"""inboxcrm: inbound email to CRM contacts and follow-ups without duplicates."""

import inboxcrm.schemas as schemas


def _load_destination_providers() -> None:
    """Each destination provider registers its name and policy block when its module is
    imported (`inboxcrm.adapters.registry`): done at the first lookup of a provider, in
    every process that validates a tenant policy (relay, worker, CLI) alike."""
    from inboxcrm.adapters.registry import load_providers

    load_providers()


schemas.DESTINATION_LOADERS.append(_load_destination_providers)
