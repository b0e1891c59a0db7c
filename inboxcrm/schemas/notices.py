"""The review notices' input and summary (docs/architecture.md §6, "Going live"). A summary
names tenants and counts only: the notices themselves carry references and reasons, never a
message's content or personal data.

No `from __future__ import annotations`: the SDK's converter reads these type hints.
"""

from dataclasses import dataclass, field


@dataclass
class ReviewNoticesInput:
    """The schedule's argument (a single dataclass, so fields can be added)."""

    max_per_message: int = 40     # a Slack message holds at most 50 blocks
    max_messages_per_tenant: int = 5


@dataclass
class ReviewNoticesSummary:
    messages: int = 0
    notices: int = 0
    failed_tenants: list[str] = field(default_factory=list)
    unconfigured_tenants: list[str] = field(default_factory=list)
