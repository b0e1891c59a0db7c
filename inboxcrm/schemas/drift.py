"""The drift check's inputs and report: what the destination holds compared with what the
ledger says was completed (docs/architecture.md §4).

A report names IDs only (operation keys, contact and intent IDs, CRM record IDs, provider
message IDs), never an address or a body. It always says what it sampled: a clean report
covers the sampled operations, not every message ever handled.

No `from __future__ import annotations`: the SDK's converter reads these type hints.
"""

from dataclasses import dataclass, field
from enum import StrEnum


class DriftKind(StrEnum):
    """What one finding says about one completed operation."""

    MISSING = "missing"                            # not at the destination any more
    CHANGED = "changed"                            # there, but no longer the record we wrote
    DUPLICATE_MESSAGE_ID = "duplicate_message_id"  # one provider ID recorded for two intents
    UNVERIFIABLE = "unverifiable"                  # the destination cannot be asked (SMTP)
    UNCHECKED = "unchecked"                        # asking failed this time (outage, 401)


# Kinds that mean the destination disagrees with the ledger (the alert's kinds).
DRIFT_KINDS = (DriftKind.MISSING, DriftKind.CHANGED, DriftKind.DUPLICATE_MESSAGE_ID)
# The operations a run samples: the contact in the CRM, the note and the two email activities
# logged on it (the inbound email, the follow-up sent), and the follow-up at the provider.
CHECKED_ACTIONS = ("crm-upsert", "crm-note", "crm-email", "send", "crm-sent")
# The CRM activities among them, found again by the key they were logged under.
LOGGED_ACTIONS = ("crm-note", "crm-email", "crm-sent")


class Trigger(StrEnum):
    SCHEDULE = "schedule"
    ON_DEMAND = "on_demand"


@dataclass
class DriftCheckInput:
    """The schedule's argument (a single dataclass, so fields can be added)."""

    window_seconds: int = 86_400
    sample_size: int = 200


@dataclass
class DriftCheckRequest:
    """One run: operations completed in [window_start, window_end) (ISO 8601, UTC)."""

    window_start: str
    window_end: str
    sample_size: int
    trigger: str = Trigger.SCHEDULE.value


@dataclass
class DriftFinding:
    kind: str        # a DriftKind
    subject: str     # e.g. "contact:{id}", "intent:{id}", "logged:{op_key}", "message:{id}"
    detail: str      # e.g. "missing_record:101", "external_id_changed:101"
    op_key: str | None = None


@dataclass
class DriftReport:
    run_id: str
    trigger: str
    window_start: str
    window_end: str
    crm: str                      # the adapters asked, e.g. "hubspot", "resend"
    mail: str
    completed_in_window: int = 0  # completed crm-upsert and send operations in the window
    sampled: int = 0              # of which this run looked at
    findings: list[DriftFinding] = field(default_factory=list)
    report_id: int | None = None
    finished_at: str | None = None

    def count(self, kind: DriftKind) -> int:
        return sum(1 for f in self.findings if f.kind == kind.value)

    @property
    def drift(self) -> int:
        return sum(self.count(kind) for kind in DRIFT_KINDS)

    def summary(self) -> "DriftSummary":
        return DriftSummary(
            report_id=self.report_id, run_id=self.run_id,
            completed_in_window=self.completed_in_window, sampled=self.sampled,
            counts={kind.value: self.count(kind) for kind in DriftKind})


@dataclass
class DriftSummary:
    """The workflow's result: counts only (the findings are in the `drift_reports` row)."""

    report_id: int | None
    run_id: str
    completed_in_window: int
    sampled: int
    counts: dict[str, int] = field(default_factory=dict)
