"""Who a reviewer is, and the proof that a decision was made by them (docs/architecture.md §6).

A *principal* is an authenticated person: the operator (`INBOXCRM_REVIEW_TOKEN`, every
tenant), a reviewer with a personal token (`inboxcrm reviewer add`), or a person signed in
through the organisation's OIDC issuer (tenants from a claim). Its `decider` string is what
the audit records; the name a person types is only a display label.

A decision sent by the desk or the CLI carries a *proof*: an HMAC-SHA256, keyed by a key
derived from the server-side `INBOXCRM_DECISION_SECRET` for proofs only, over a canonical
JSON encoding of the whole decision (`DecisionClaim`: decider, path, workflow ID, wait ID,
action, and the body's label, note, evidence, corrections and `send_followup`). Keys by
purpose: sessions, CSRF tokens and proofs each use their own HKDF-SHA256 key
(`derived_key`), so none is the secret itself.

The bookkeeping activity verifies the proof before recording the decider. A proof that does
not match the body it came with (copied from history and sent with other corrections, a
note changed, a forged one, or a proof of the format before it covered the body) makes the
workflow refuse the decision (`proof_invalid`); a decision without a proof (the Temporal UI,
any other Temporal client) is refused in production (`unproven_decision`) unless the
operator declares that Temporal authenticates and scopes its users
(`INBOXCRM_TEMPORAL_AUTHORIZES_DECISIONS`), and is otherwise recorded with the identity
Temporal recorded for the request. A proof is bound to one wait, so copying it from
history cannot answer any other wait.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

OPERATOR = "operator"
# The paths a decision can come through (the audit's `path`).
PATH_DESK = "desk"
PATH_CLI = "cli"
PATH_UI_SIGNAL = "temporal-ui signal"
PATH_UI_UPDATE = "temporal-ui update"
PROVEN_PATHS = frozenset({PATH_DESK, PATH_CLI})
TOKEN_PREFIX = "icr_"


@dataclass(frozen=True)
class Principal:
    """An authenticated person. `tenants` None: every tenant (the operator)."""

    decider: str                      # operator | reviewer:NAME | oidc:WHO
    name: str                         # what the desk greets them with
    tenants: frozenset[str] | None
    reviewer_id: int | None = None    # a personal-token reviewer's row
    # A personal-token reviewer's role (`reviewer`, `lead`, …): what a policy's authority
    # rule asks for (`authority.repeat_customer_facing`). None: the operator, an OIDC user.
    role: str | None = None

    def may_see(self, tenant: str | None) -> bool:
        return tenant is not None and (self.tenants is None or tenant in self.tenants)


def operator() -> Principal:
    return Principal(OPERATOR, OPERATOR, None)


def new_token() -> str:
    """A personal token: 32 random bytes, URL-safe, with a recognisable prefix."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> bytes:
    """What the store keeps of a token (SHA-256: the token is high-entropy, so a plain hash
    is enough; it is never shown again)."""
    return hashlib.sha256(token.strip().encode()).digest()


PROOF_PURPOSE = "decision-proof"
PROOF_FORMAT = "inboxcrm-decision.v2"
PROOF_PREFIX = "v2:"


@dataclass(frozen=True)
class DecisionClaim:
    """Everything a decision's proof covers: who, through which path, which wait of which
    workflow, the action, and the body as the workflow reads it (`reviewer` the label as
    `schemas.models.REVIEWER_LABEL_CHARS` cuts it)."""

    decider: str
    path: str
    workflow_id: str
    wait_id: str
    action: str
    reviewer: str = ""
    note: str | None = None
    evidence: str | None = None
    corrections: Mapping[str, str] = field(default_factory=dict)
    send_followup: bool = True
    # An approval of an edited draft: the SHA-256 of its text (docs/architecture.md §6,
    # "Edited drafts"). Covered only when set, so a proof made before it still verifies.
    draft_sha256: str | None = None

    def message(self) -> bytes:
        """The canonical encoding: JSON with sorted keys, no spaces, UTF-8 (one byte string
        per decision, whatever order or spelling the body arrived in)."""
        fields: dict[str, object] = {
            "format": PROOF_FORMAT, "decider": self.decider, "path": self.path,
            "workflow_id": self.workflow_id, "wait_id": self.wait_id, "action": self.action,
            "reviewer": self.reviewer, "note": self.note, "evidence": self.evidence,
            "corrections": dict(self.corrections), "send_followup": self.send_followup}
        if self.draft_sha256 is not None:
            fields["draft_sha256"] = self.draft_sha256
        return json.dumps(fields, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()


def sign_decision(secret: str, claim: DecisionClaim) -> str:
    mac = hmac.new(derived_key(secret, PROOF_PURPOSE), claim.message(), hashlib.sha256)
    return PROOF_PREFIX + mac.hexdigest()


def verify_decision(secret: str | None, proof: str | None, claim: DecisionClaim) -> bool:
    """True only for a proof made with this secret's proof key over exactly this decision,
    body included. A proof of the earlier formats (over decider, path, workflow, wait and
    action only) proves nothing any more: it would let its body be changed."""
    if (not secret or not proof or not claim.decider or claim.path not in PROVEN_PATHS
            or not claim.wait_id):
        return False
    return hmac.compare_digest(sign_decision(secret, claim).encode(), proof.encode())


def derived_key(secret: str, purpose: str) -> bytes:
    """The key of one purpose (`review-session`, `review-csrf`, `decision-proof`) from the
    server-side secret: HKDF-SHA256 (RFC 5869), the purpose as its info, 32 bytes."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"inboxcrm.keys.v1",
                info=f"inboxcrm.{purpose}".encode()).derive(secret.encode())
