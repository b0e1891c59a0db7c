"""The scheduled retention run's input and summary (docs/architecture.md §7, "Retention").
Tenants and counts only.

No `from __future__ import annotations`: the SDK's converter reads these type hints.
"""

from dataclasses import dataclass, field


@dataclass
class RetentionInput:
    """The schedule's argument (a single dataclass, so fields can be added)."""

    batch_size: int = 500         # rows per kind per transaction
    max_batches_per_tenant: int = 200


@dataclass
class RetentionTenant:
    tenant: str
    raw: int = 0
    evidence: int = 0
    audit: int = 0
    more_due: bool = False        # the batch cap was reached: the next run goes on


@dataclass
class RetentionSummary:
    tenants: list[RetentionTenant] = field(default_factory=list)
