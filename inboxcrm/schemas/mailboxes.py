"""The watcher of one mailbox folder: its workflow's name, ID, input and what a watch or a
catch-up did (docs/mailboxes.md)."""

from __future__ import annotations

from dataclasses import dataclass

MAILBOX_WATCH_WORKFLOW_TYPE = "MailboxWatchWorkflow"
SYNC_UPDATE = "sync"


def mailbox_workflow_id(tenant: str, kind: str, address: str, folder: str) -> str:
    """`mailbox/{tenant}/{kind}/{address}/{folder}`: the mailbox folder's identity, so one
    watcher runs per folder however many workers poll (docs/architecture.md §10)."""
    return f"mailbox/{tenant}/{kind}/{address}/{folder}"


@dataclass
class MailboxWatch:
    """Which folder to watch and the watcher's rhythm. The connection settings and the
    credential's variable name are read from the registration each time it connects."""

    tenant: str
    kind: str
    address: str
    folder: str
    # A worker killed mid-fetch is noticed after this long; the next attempt carries on.
    heartbeat_seconds: float = 20.0
    # One watch activity ends after this long (the workflow starts the next); RFC 2177 asks
    # clients to re-issue IDLE at least every 29 minutes, this watcher does every idle_seconds.
    session_seconds: float = 1800.0
    idle_seconds: float = 300.0
    # Each watch session adds about ten events to the run's history; past this many the run
    # continues as new (well before the server's limits and its suggestion).
    history_events_limit: int = 2000


@dataclass
class WatchSummary:
    """What one watch session or one catch-up stored. `removed`: the registration is gone,
    the watcher ends."""

    stored: int = 0
    duplicates: int = 0
    copies: int = 0
    reseen: int = 0
    too_large: int = 0
    connections: int = 0
    removed: bool = False

    def add(self, other: WatchSummary) -> None:
        self.stored += other.stored
        self.duplicates += other.duplicates
        self.copies += other.copies
        self.reseen += other.reseen
        self.too_large += other.too_large
        self.connections += other.connections
        self.removed = self.removed or other.removed


# The Gmail watcher (workflows/mailbox_gmail.py): its own workflow type under the same ID
# pattern; the relay's Pub/Sub route signals it with the push's historyId.
GMAIL_WATCH_WORKFLOW_TYPE = "GmailWatchWorkflow"
GMAIL_PUSH_SIGNAL = "gmail_push"
# Asked by the Gmail watcher when it is cancelled (`inboxcrm mailbox remove`): runs that
# record it stop the watch at Gmail's end (`users.stop`); runs cancelled before it ended
# without (docs/architecture.md §5).
GMAIL_STOP_PATCH = "gmail-stop-on-remove"
