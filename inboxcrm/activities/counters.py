"""The steps' own counters (`count`, bound once per label set): the implementation lives in
`inboxcrm/platform/meter.py` so an adapter, called inside a step, can count what only it sees
(a provider's 409, `inboxcrm/platform/conflicts.py`)."""

from __future__ import annotations

from inboxcrm.platform.meter import count

__all__ = ["count"]
