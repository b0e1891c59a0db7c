"""Which tenant an authenticated delivery may write into (docs/architecture.md §7, §10).

A credential is bound to tenants: a tenant's own Standard Webhooks secret
(`INBOXCRM_WEBHOOK_SECRET_<TENANT>`) to that tenant; a shared one (`INBOXCRM_WEBHOOK_SECRET`,
the Postmark pair, the Mailgun key) to the tenants whose policy lists it in
`inbound_credentials`. The tenant is then read only from authenticated data: the signed body
(Standard Webhooks) or the envelope recipient the provider reports (Postmark
`OriginalRecipient`, Mailgun `recipient`), never from a query parameter or a `To`/`Cc`
header the sender wrote. A delivery outside the binding is a 403 and nothing is stored.

The headers only ever choose a mailbox *within* the one tenant a credential is bound to
(when the envelope recipient is a provider address that names no tenant's mailbox).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from email_validator import EmailNotValidError, validate_email

from inboxcrm.domain.policy import (
    InboundCredential,
    PolicyError,
    UnknownTenant,
    get_policy,
    load_policies,
    tenant_for_mailbox,
    tenants_accepting,
)
from inboxcrm.ingress.intake import BadRequest
from inboxcrm.schemas.destinations import tenant_env_suffix


class Forbidden(Exception):
    """Authenticated, but not for this tenant: answered 403 with this (payload-free)
    message; nothing is stored."""


@dataclass(frozen=True)
class Binding:
    """The tenants one authenticated credential may write into."""

    credential: str
    tenants: frozenset[str]

    @classmethod
    def shared(cls, credential: InboundCredential) -> Binding:
        """A shared credential: the tenants whose policy lists it, as the policies are now
        (they are re-read when their files change)."""
        return cls(credential, tenants_accepting(credential))

    @classmethod
    def own(cls, tenant: str) -> Binding:
        """A tenant's own secret (the variable's suffix names the tenant)."""
        return cls(f"standard:{tenant}", frozenset({tenant}))

    def allows(self, tenant: str) -> bool:
        wanted = tenant_env_suffix(tenant)
        return any(tenant_env_suffix(t) == wanted for t in self.tenants)


def warn_unbound(log: logging.Logger, make: Callable[[], Binding]) -> None:
    """At start: a configured credential that no tenant accepts refuses every delivery."""
    try:
        policies = load_policies()
        binding = make()
    except PolicyError as exc:
        log.warning("tenant policies unreadable at start: %s", exc)
        return
    known = {tenant_env_suffix(t) for t in policies}
    if not any(tenant_env_suffix(t) in known for t in binding.tenants):
        log.warning("credential %r is bound to no tenant (no policy lists it, or its tenant "
                    "has no policy): every delivery it signs is a 403", binding.credential)


def check_tenant(bindings: Iterable[Binding], tenant: str) -> None:
    """Raise Forbidden unless one of the credentials that authenticated the request is
    bound to `tenant`."""
    if not any(binding.allows(tenant) for binding in bindings):
        raise Forbidden("the credential is not bound to this tenant")


def _normalise(address: str) -> str | None:
    """The address as tenant policies store mailboxes (see inboxcrm.domain.policy), or None."""
    if not isinstance(address, str) or not address.strip() or len(address) > 320:
        return None
    try:
        result = validate_email(address.strip(), check_deliverability=False,
                                test_environment=True, allow_display_name=False,
                                allow_quoted_local=False, allow_domain_literal=False)
    except (EmailNotValidError, ValueError, UnicodeError):
        return None
    return str(result.normalized).lower()


def _variants(address: str) -> list[str]:
    """The address, then without a `+tag` (Postmark's MailboxHash, Mailgun plus addressing)."""
    normalised = _normalise(address)
    if normalised is None:
        return []
    local, _, domain = normalised.rpartition("@")
    if "+" in local:
        return [normalised, f"{local.split('+', 1)[0]}@{domain}"]
    return [normalised]


def resolve_recipient(binding: Binding, envelope: Iterable[str | None],
                      headers: Iterable[str | None] = ()) -> tuple[str, str]:
    """(tenant, mailbox) of a provider delivery authenticated by `binding`.

    The first envelope recipient that is a mailbox of a bound tenant decides. An envelope
    recipient owned by a tenant outside the binding is a Forbidden (403). When no envelope
    recipient is any tenant's mailbox (a provider's own inbound address), a credential bound
    to exactly one tenant may take the mailbox from the `To`/`Cc` headers, among that
    tenant's own mailboxes only. Otherwise BadRequest (422, unknown mailbox)."""
    foreign = False
    for candidate in envelope:
        for address in _variants(candidate) if candidate else []:
            owner = tenant_for_mailbox(address)
            if owner is not None and binding.allows(owner):
                return owner, address
            foreign = foreign or owner is not None
    if foreign:
        raise Forbidden("the envelope recipient belongs to a tenant this credential is not "
                        "bound to")
    if len(binding.tenants) == 1:
        [tenant] = binding.tenants
        try:
            mailboxes = get_policy(tenant).mailboxes
        except UnknownTenant:
            raise Forbidden("the credential is bound to no known tenant") from None
        for candidate in headers:
            for address in _variants(candidate) if candidate else []:
                if address in mailboxes:
                    return tenant, address
    raise BadRequest("unknown mailbox: no tenant policy lists the envelope recipient of "
                     "this message as a mailbox")
