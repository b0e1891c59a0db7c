"""The `inboxcrm` console script: one module per group of commands (`stack`, `items`,
`review`, `verify`, `extract`), assembled in `inboxcrm.cli.main`. The only package that
prints."""

from __future__ import annotations

from inboxcrm.cli.main import app, main

__all__ = ["app", "main"]
