"""Who the CLI's review commands act as (docs/architecture.md §6): the reviewer whose personal
token is in `INBOXCRM_REVIEWER_TOKEN`, or, without one, the operator holding
`INBOXCRM_REVIEW_TOKEN` (every tenant, recorded as `operator`). `--reviewer` is a label. The
decision's body and proof are built by the one decision client
(`inboxcrm/platform/decisions.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from inboxcrm.platform.reviewer_identity import Principal, operator, token_digest
from inboxcrm.store import reviewers as store

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings
    from inboxcrm.store.db import Conn

REVIEWER_TOKEN_VARIABLE = "INBOXCRM_REVIEWER_TOKEN"


class NotAuthorised(Exception):
    """No credential, or one that is not (or no longer) valid; the message says which."""


async def cli_principal(conn: Conn, environ: Mapping[str, str], settings: Settings
                        ) -> Principal:
    token = environ.get(REVIEWER_TOKEN_VARIABLE, "").strip()
    if token:
        row = await store.active_by_token(conn, token_digest(token))
        if row is None:
            raise NotAuthorised(f"{REVIEWER_TOKEN_VARIABLE} is not the token of a current "
                                "reviewer (revoked, or mistyped)")
        return Principal(f"reviewer:{row['name']}", row["name"], frozenset(row["tenants"]),
                         reviewer_id=row["reviewer_id"], role=row["role"])
    if settings.review_token is not None and settings.review_token.get_secret_value():
        return operator()
    raise NotAuthorised(f"set {REVIEWER_TOKEN_VARIABLE} (your personal token from `inboxcrm "
                        "reviewer add`) or INBOXCRM_REVIEW_TOKEN (the operator's)")
