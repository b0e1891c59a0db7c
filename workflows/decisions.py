"""Reviewer decisions for InboundEmailWorkflow: what a signal may say, how its body is
validated, and what the Temporal UI shows while an item waits for a person.

Pure, deterministic helpers, imported as passthrough (not re-executed per workflow run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.exceptions import ApplicationError

from schemas.models import ItemState, ReviewDecision

REVIEW_ACTIONS = {"approve", "hold", "reject"}
RECOVERY_ACTIONS = {"retry", "resolve", "hold", "reject"}
DECISION_FIELDS = {"reviewer", "note", "evidence", "corrections"}


@dataclass
class Signal:
    action: str
    body: Any


@dataclass
class Waiting:
    kind: str                      # review | recovery
    reason: str
    allowed: set[str]
    op_key: str | None = None
    since: str = ""


class Rejected(Exception):
    """A reviewer rejected the item: the run ends in `rejected`."""


CHOICES = {
    "approve": "approve: continue processing (optionally with corrected fields)",
    "hold": "hold: keep it parked in the queue",
    "reject": "reject: end it; nothing more is written or sent",
    "retry": "retry: run the step again with the same operation key",
    "resolve": "resolve: the side effect exists; record the evidence and continue",
}


def details(waiting: Waiting, state: ItemState) -> str:
    """What the UI shows on the workflow page: why it waits and what each choice does.
    References and reasons only, never personal data."""
    lines = [f"**Waiting for a person** ({state.value}): `{waiting.reason}`"]
    if waiting.op_key:
        lines.append(f"Operation: `{waiting.op_key.rsplit(':', 1)[-1]}`")
    lines.append("Send a signal with body `{\"reviewer\": \"your name\", \"note\": \"...\"}`:")
    lines += [f"- {CHOICES[action]}" for action in sorted(waiting.allowed)]
    return "\n".join(lines)


def first(reasons: list[str], default: str) -> str:
    return reasons[0] if reasons else default


def reason_of(cause: ApplicationError) -> str:
    """'permanent: http_400:VALIDATION_ERROR' → 'http_400:VALIDATION_ERROR'."""
    return cause.message.split(": ", 1)[-1] or "permanent_error"


def parse_decision(signal: Signal) -> tuple[ReviewDecision | None, str | None]:
    body = signal.body
    if not isinstance(body, dict):
        return None, "body_not_an_object"
    unknown = set(body) - DECISION_FIELDS
    if unknown:
        return None, "unknown_fields"
    reviewer = body.get("reviewer")
    if not isinstance(reviewer, str) or not reviewer.strip():
        return None, "reviewer_required"
    corrections = body.get("corrections") or {}
    if not isinstance(corrections, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in corrections.items()
    ):
        return None, "corrections_not_string_map"
    for name in ("note", "evidence"):
        if body.get(name) is not None and not isinstance(body[name], str):
            return None, f"{name}_not_a_string"
    return ReviewDecision(action=signal.action, reviewer=reviewer.strip()[:200],
                          note=body.get("note"), evidence=body.get("evidence"),
                          corrections=corrections), None
