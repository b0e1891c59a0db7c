"""The Microsoft Graph watcher of one mailbox's Inbox: its workflow's name, input, the
signal the relay sends it for each verified notification, and what it asks its activities
(docs/mailboxes.md, "Microsoft 365 (Graph)")."""

from __future__ import annotations

from dataclasses import dataclass, field

GRAPH_WATCH_WORKFLOW_TYPE = "GraphMailboxWorkflow"
GRAPH_NOTICE_SIGNAL = "graph_notice"
GRAPH_KIND = "graph"
# Graph's well-known name of the folder watched (a subscription on its messages, `created`).
GRAPH_FOLDER = "inbox"
# The lifecycle events of Graph's subscriptions the watcher acts on.
LIFECYCLE_EVENTS = ("reauthorizationRequired", "subscriptionRemoved", "missed")


@dataclass
class GraphWatch:
    """Which mailbox to watch and the watcher's rhythm; the credential's variable name is
    read from the registration at each call."""

    tenant: str
    address: str
    folder: str = GRAPH_FOLDER
    # Activities heartbeat; a worker that dies is noticed after this long.
    heartbeat_seconds: float = 20.0
    # With no notification for this long the watcher runs the delta query anyway: a lost
    # notification costs at most this long, and the stall alert sees a checked mailbox.
    poll_seconds: float = 300.0
    # The subscription is asked to last this long and renewed once less than
    # `renew_ahead_seconds` is left (Graph allows under 7 days for Outlook messages).
    subscription_seconds: float = 3 * 86_400.0
    renew_ahead_seconds: float = 36 * 3600.0
    history_events_limit: int = 2000


@dataclass
class GraphNotice:
    """What the relay verified for one mailbox: the immutable IDs of `created` messages and
    the lifecycle events (`missed`, `reauthorizationRequired`, `subscriptionRemoved`)."""

    ids: list[str] = field(default_factory=list)
    lifecycle: list[str] = field(default_factory=list)


@dataclass
class GraphSubscriptionAsk:
    watch: GraphWatch
    renew: bool = False
    recreate: bool = False


@dataclass
class GraphSubscriptionState:
    """`created`: a new subscription (what happened before it is caught up by delta);
    `next_check_seconds`: when renewal is due; `removed`: the registration is gone."""

    created: bool = False
    next_check_seconds: float = 3600.0
    removed: bool = False
    # What `remove` needs to delete the subscription at Graph's end once the registration
    # (and with it the stored subscription) is gone.
    subscription_id: str | None = None
    token_env: str | None = None


@dataclass
class GraphUnsubscribe:
    watch: GraphWatch
    subscription_id: str
    token_env: str


@dataclass
class GraphFetch:
    watch: GraphWatch
    ids: list[str] = field(default_factory=list)
