"""Local stack: embedded PostgreSQL, Temporal dev server, sandbox, worker and relay."""
