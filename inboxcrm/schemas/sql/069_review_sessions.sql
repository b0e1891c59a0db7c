-- The review desk's sessions, server-side (docs/architecture.md §6, "Sessions"; issue 36): a
-- session cookie names a row here by a random ID, of which only the SHA-256 is kept. Sign-out
-- ends the row (a replayed cookie is refused), an idle session past
-- INBOXCRM_REVIEW_SESSION_IDLE_MINUTES is refused, and an operator session is bound to an
-- HMAC of the operator token that signed it in, so rotating INBOXCRM_REVIEW_TOKEN ends it.
-- No personal data: `who` is `op` or `r<reviewer_id>`, the decider the desk already uses.
CREATE TABLE review_sessions (
    session_sha256 bytea       PRIMARY KEY,
    who            text        NOT NULL,
    credential     text        NOT NULL,   -- HMAC of the signing-in credential ('' reviewers)
    created_at     timestamptz NOT NULL DEFAULT now(),
    last_seen_at   timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    ended_at       timestamptz
);

CREATE INDEX review_sessions_expires_at ON review_sessions (expires_at);
