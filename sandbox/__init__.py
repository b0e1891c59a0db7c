"""`python -m sandbox` from the repository root, as docs/architecture.md names it: the sandbox
itself is `inboxcrm.sandbox`, so an installed wheel adds no top-level `sandbox` package; this
folder is not packaged."""
