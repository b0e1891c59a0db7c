-- The wait a review task answers (docs/architecture.md §6): its ID, the decisions allowed
-- at it, and whether an approval must name the sender. Written by the workflow when the wait
-- opens; read by the review card. A task re-opened for a new wait gets a new escalation time.
ALTER TABLE review_tasks
    ADD COLUMN wait_id      text,
    ADD COLUMN allowed      jsonb   NOT NULL DEFAULT '[]',
    ADD COLUMN needs_sender boolean NOT NULL DEFAULT false;
