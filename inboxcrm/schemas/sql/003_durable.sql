-- Durable for days (docs/architecture.md §3, §4): what lets an item survive long outages,
-- overlapping attempts and messages that crash the worker.
--
-- Fencing needs no column: an operation's claim token is its attempt number (`attempts`),
-- and every write an attempt makes is conditioned on it (inboxcrm/store/ledger.py).

-- A reviewer's `retry` of an uncertain outcome ("I checked: it did not happen") leaves
-- last_error_category = 'checked_not_sent', so the next claim sends instead of reconciling.
COMMENT ON COLUMN operations.last_error_category IS
    'transient | permanent | unknown | checked_not_sent (a reviewer answered an unknown outcome)';

-- Attempts of the steps outside the ledger (extraction, planning), counted where a crash
-- cannot forget them: a local activity's own attempt count dies with the workflow task, so a
-- message that kills the worker would be retried forever. `started` counts attempts begun
-- and not finished; an attempt that ends (success or an ordinary failure) resets it; past
-- the limit the item is blocked as `crash_loop` for a person (activities/step_attempts.py).
CREATE TABLE step_attempts (
    workflow_id  text        NOT NULL,
    step         text        NOT NULL,
    started      integer     NOT NULL DEFAULT 0,
    last_started timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, step)
);
