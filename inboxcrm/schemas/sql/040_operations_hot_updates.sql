-- An operation row is updated twice per attempt (claimed, then completed or failed). The
-- B-tree on its completion time (005: the drift check's sample of completed operations)
-- covered `last_transition` and `status`, both changed by every one of those updates, so
-- none could be heap-only (HOT): each wrote a new entry into every index of the table
-- (`make bench`: 0 of ~6 operation updates per item were HOT). A BRIN index summarises
-- block ranges instead, and since PostgreSQL 16 an update that changes only columns of
-- summarising indexes stays HOT. Rows are written in completion order closely enough for
-- the block ranges to bound the drift check's time window.
DROP INDEX IF EXISTS operations_completed;
CREATE INDEX operations_transition ON operations USING brin (last_transition);
