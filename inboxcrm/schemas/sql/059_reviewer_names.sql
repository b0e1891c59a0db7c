-- A reviewer's name is theirs for good (docs/architecture.md §7, "Reviewers"): the audit and
-- every decision proof name `reviewer:NAME`, so a name a revoked reviewer held is never given
-- to someone else. `inboxcrm reviewer rotate` gives the same person a new token under the
-- same name (a new reviewers row; the old token and its desk sessions end).
CREATE TABLE reviewer_names (
    name        text        PRIMARY KEY,
    reviewer_id bigint      NOT NULL REFERENCES reviewers (reviewer_id),  -- the first holder
    claimed_at  timestamptz NOT NULL DEFAULT now()
);

INSERT INTO reviewer_names (name, reviewer_id, claimed_at)
SELECT DISTINCT ON (name) name, reviewer_id, created_at FROM reviewers
ORDER BY name, reviewer_id;
