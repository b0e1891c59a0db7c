-- Privacy in the store (docs/architecture.md §7, "Database roles"): each process kind works
-- under a role of its own (inboxcrm_relay, _desk, _worker, _operator) with only the grants
-- declared in inboxcrm/store/roles.py, applied by the migration runner after every run. A
-- role gets a table only by that declaration: nothing of the schema is granted to PUBLIC
-- (every role), whatever an earlier hand-made grant left.
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM PUBLIC;
