"""Local stand-in for a HubSpot-compatible CRM and a Resend-compatible mail provider.

It behaves like the real services where duplicates are concerned (unique external IDs,
idempotency keys, a lagging search index) and can inject faults on demand. Run it with
`python -m sandbox`; build it in-process with `sandbox.app.create_app`.
"""

from __future__ import annotations

from inboxcrm.sandbox.app import create_app

__all__ = ["create_app"]
