"""Who a reviewer is, and the proof that a decision was made by them (docs/architecture.md §6).

A *principal* is an authenticated person: the operator (`INBOXCRM_REVIEW_TOKEN`, every
tenant), a reviewer with a personal token (`inboxcrm reviewer add`), or a person signed in
through the organisation's OIDC issuer (tenants from a claim). Its `decider` string is what
the audit records; the name a person types is only a display label.

A decision sent by the desk or the CLI carries a *proof*: an HMAC-SHA256, keyed by a key
derived from the server-side `INBOXCRM_DECISION_SECRET` for proofs only, over (decider, path,
workflow ID, wait ID, action). Keys by purpose: sessions, CSRF tokens and proofs each use
their own HKDF-SHA256 key (`derived_key`), so none is the secret itself. A proof made
before the split (HMAC keyed by the secret itself) still verifies, so a decision a running
workflow holds across the upgrade keeps its proof; new ones are made with the proof key.
The bookkeeping activity verifies it before recording the decider; a decision without a valid
proof (the Temporal UI, any other Temporal client, or a forged body) is recorded with the
identity Temporal recorded for the request instead. A proof is bound to one wait and one
action, so copying it from history cannot answer any other wait.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

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


def _message(decider: str, path: str, workflow_id: str, wait_id: str, action: str) -> bytes:
    return "\n".join(("inboxcrm-decision.v1", decider, path, workflow_id, wait_id,
                      action)).encode()


PROOF_PURPOSE = "decision-proof"


def sign_decision(secret: str, decider: str, path: str, workflow_id: str, wait_id: str,
                  action: str) -> str:
    return hmac.new(derived_key(secret, PROOF_PURPOSE),
                    _message(decider, path, workflow_id, wait_id, action),
                    hashlib.sha256).hexdigest()


def verify_decision(secret: str | None, proof: str | None, decider: str, path: str,
                    workflow_id: str, wait_id: str, action: str) -> bool:
    """True only for a proof made with this secret's proof key (or, made before keys were
    split by purpose, with the secret itself) over exactly these values."""
    if not secret or not proof or not decider or path not in PROVEN_PATHS or not wait_id:
        return False
    message = _message(decider, path, workflow_id, wait_id, action)
    for key in (derived_key(secret, PROOF_PURPOSE), secret.encode()):
        expected = hmac.new(key, message, hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected.encode(), proof.encode()):
            return True
    return False


def derived_key(secret: str, purpose: str) -> bytes:
    """The key of one purpose (`review-session`, `review-csrf`, `decision-proof`) from the
    server-side secret: HKDF-SHA256 (RFC 5869), the purpose as its info, 32 bytes."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"inboxcrm.keys.v1",
                info=f"inboxcrm.{purpose}".encode()).derive(secret.encode())
