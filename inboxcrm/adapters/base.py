"""The adapter interfaces the CRM and send activities program against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from inboxcrm.adapters.errors import Classified


class AdapterError(Exception):
    """A classified failure of an external call. The message carries no payload."""

    def __init__(self, classified: Classified) -> None:
        super().__init__(f"{classified.category.value}: {classified.reason}")
        self.classified = classified


@dataclass(frozen=True)
class ContactFields:
    email: str
    name: str | None = None
    company: str | None = None


@dataclass(frozen=True)
class CrmRecord:
    record_id: str
    created: bool | None = None  # None when the destination does not say
    adopted: bool = False        # an existing record with that email was adopted (409)


class CrmClient(Protocol):
    name: str

    async def upsert_contact(self, external_id: str, fields: ContactFields) -> CrmRecord:
        """Create or update the contact keyed by our unique external ID. Safe to repeat."""
        ...

    async def find_contact(self, external_id: str) -> CrmRecord | None:
        """Look the contact up by external ID; read-after-write consistent where possible."""
        ...

    async def log_note(self, note_key: str, record_id: str, text: str) -> str:
        """Log the inbound email on the contact, keyed by `note_key`. Safe to repeat."""
        ...

    async def find_note(self, note_key: str) -> str | None:
        """The note logged under `note_key`, if any (reconciliation)."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class OutgoingEmail:
    to: str
    subject: str
    text: str
    headers: dict[str, str] = field(default_factory=dict)
    # `time.monotonic()` by which the delivery must be over (the end of the send lease): an
    # adapter that cannot finish by then must not start handing the message over.
    deliver_by: float | None = None


@dataclass(frozen=True)
class SentEmail:
    message_id: str


class MailClient(Protocol):
    name: str
    # False where an unknown outcome cannot be reconciled (no idempotency, no search): SMTP.
    reconcilable: bool

    async def send(self, idempotency_key: str, message: OutgoingEmail) -> SentEmail: ...

    async def find_sent(self, idempotency_key: str) -> SentEmail | None: ...

    async def aclose(self) -> None: ...
