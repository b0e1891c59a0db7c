"""The words every room shares (docs/architecture.md §9).

`DESTINATION_LOADERS`: what the product installs so that the catalogue of destination
providers (`schemas.destinations`) is complete at its first lookup. The providers live in a
room above this one; the product passes their loader in (`inboxcrm/__init__.py`) instead of
this room importing theirs, and nothing is loaded until a destination is looked up, so a
process that never validates one (a work-pool child) never imports the adapters."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

DESTINATION_LOADERS: list[Callable[[], None]] = []
