"""The consent sync's input and summary (ConsentSyncWorkflow, docs/consent.md)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ConsentSyncInput:
    # One tenant only (an operator's catch-up, a test); None: every tenant.
    tenant: str | None = None
    batch_size: int = 100


@dataclass
class ConsentSyncSummary:
    written: int = 0
    failed: int = 0
    blocked: int = 0
    # Rows whose CRM has no opt-out field (CrmConsent): left to inboxcrm's list alone.
    not_supported: int = 0
    tenants: list[str] = field(default_factory=list)
