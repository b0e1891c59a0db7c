-- Durable for days (docs/architecture.md §3, §4): what lets an item survive long outages,
-- overlapping attempts and messages that crash the worker.
--
-- Fencing needs no column: an operation's claim token is its attempt number (`attempts`),
-- and every write an attempt makes is conditioned on it (inboxcrm/store/ledger.py).

-- A reviewer's `retry` of an uncertain outcome ("I checked: it did not happen") leaves
-- last_error_category = 'checked_not_sent', so the next claim sends instead of reconciling.
COMMENT ON COLUMN operations.last_error_category IS
    'transient | permanent | unknown | checked_not_sent (a reviewer answered an unknown outcome)';
