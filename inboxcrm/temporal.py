"""Temporal client construction and the custom search attributes of DESIGN.md section 6."""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client

from inboxcrm.config import Settings

SEARCH_ATTRIBUTES: dict[str, IndexedValueType.ValueType] = {
    "InboxState": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "ReviewReason": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "ReviewOwner": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "Tenant": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "NeedsReview": IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
    "ReviewOverdue": IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
}

# `temporal server start-dev --search-attribute` spelling of the same set.
DEV_SERVER_FLAGS = [
    f"{name}={'Bool' if kind == IndexedValueType.INDEXED_VALUE_TYPE_BOOL else 'Keyword'}"
    for name, kind in SEARCH_ATTRIBUTES.items()
]


async def connect(settings: Settings, *, lazy: bool = False) -> Client:
    from inboxcrm.codec import data_converter  # payload encryption (DESIGN.md section 7)

    return await Client.connect(
        settings.temporal_address, namespace=settings.temporal_namespace, lazy=lazy,
        data_converter=data_converter(settings),
    )


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register any missing custom search attribute (idempotent). Returns the added names."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = {
        name: kind for name, kind in SEARCH_ATTRIBUTES.items()
        if name not in existing.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(search_attributes=missing, namespace=namespace)
        )
    return sorted(missing)
