"""Workflow definitions: deterministic orchestration only (no I/O, clocks or randomness)."""
