"""`inboxcrm_unique_conflicts_total{kind}`: a unique constraint (ours in PostgreSQL, or a
provider's) answered a write another writer made first (docs/architecture.md §8). Each is
handled (the existing row or record is used, never a second one), but a sustained rate says
two writers keep racing for the same thing (a redelivery storm, two readers of one mailbox,
people creating the same contacts in the CRM), and the alert `InboxcrmUniqueConflicts` asks a
person to look. `kind` is one of a fixed set, never anything of the message or the person."""

from __future__ import annotations

from enum import StrEnum

from temporalio import activity

from inboxcrm.platform.meter import count

NAME = "inboxcrm_unique_conflicts"
DESCRIPTION = ("Writes a unique constraint answered with another writer's row or record "
               "(kind: intake_delivery, mailbox_message, crm_contact_email, "
               "crm_email_activity)")


class ConflictKind(StrEnum):
    # The relay: a concurrent request stored the same delivery first (inbound_events key).
    INTAKE_DELIVERY = "intake_delivery"
    # A mailbox read (IMAP, Gmail, Graph): a concurrent read stored the message first.
    MAILBOX_MESSAGE = "mailbox_message"
    # HubSpot's email uniqueness: a contact we did not create owns the address (409, adopted).
    CRM_CONTACT_EMAIL = "crm_contact_email"
    # HubSpot's unique email-activity key: our activity was logged already (a lost answer).
    CRM_EMAIL_ACTIVITY = "crm_email_activity"


def count_conflict(kind: ConflictKind) -> None:
    """Count one on the worker's meter. Outside a step (an operator command calling an
    adapter) there is no meter to export it on: nothing is counted."""
    if activity.in_activity():
        count("inboxcrm_unique_conflicts", DESCRIPTION, kind=kind.value)
