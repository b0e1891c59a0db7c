"""The inbound sources, named once. A name is the source's part of every workflow ID
(`inbound/{tenant}/{source}/...`), its label on the relay's delivery metrics, the credential
name a tenant policy lists in `inbound_credentials`, and the module that implements it:
`inboxcrm/ingress/sources/<name>.py` (the relay imports exactly these). Everything that
spells a source name (policies, sender authentication, settings, the CLI) derives from here.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

# Push sources: a provider POSTs each delivery to `/v1/inbound/<name>` (docs/architecture.md
# §10). Pull sources (mailbox watchers, `PullSource` of inboxcrm/ingress/sources/base.py)
# get a Literal of their own beside this one: they are not credentials a policy lists.
SourceName = Literal["standard", "postmark", "mailgun"]
SOURCE_NAMES: Final[tuple[SourceName, ...]] = get_args(SourceName)
