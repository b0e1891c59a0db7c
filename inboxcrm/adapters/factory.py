"""Build the CRM and mail adapters: the global ones from settings, and each tenant's own
from its policy (`Destinations`, the worker's only constructor; docs/architecture.md §5).

`INBOXCRM_CRM_PROVIDER` and `INBOXCRM_MAIL_PROVIDER` name a registered provider
(`inboxcrm.adapters.registry`; `sandbox` by default): each provider's module says how its
client is built, from the settings and from a tenant's policy block, once. The sandbox is
HubSpot-compatible and Resend-compatible, so `sandbox` uses those adapters against
`INBOXCRM_SANDBOX_URL` (or `INBOXCRM_CRM_URL` / `INBOXCRM_MAIL_URL` when set). A real
provider without its URL gets the provider's public API; a provider whose settings are
incomplete is an error at start-up, never a silent fallback to the sandbox.

A tenant whose policy names its own `destinations.crm` / `destinations.mail` gets clients
of its own, built on first use and kept (one per tenant and configuration); a tenant that
names none uses the global ones. A tenant's destination that cannot be built (a secret
reference that resolves to nothing) is an error for that tenant's items only, never a
fallback to another account.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inboxcrm.adapters.base import CrmClient, CrmGuarantee, GuaranteeCheck, MailClient
from inboxcrm.adapters.registry import (
    ConfigurationError,
    Secrets,
    crm_provider,
    mail_provider,
    resolve_secret,
)
from inboxcrm.schemas.destinations import (
    CrmDestination,
    DestinationRefused,
    MailDestination,
    ProviderDestination,
    TenantDestinations,
    check_block,
)

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings

__all__ = ["ConfigurationError", "DestinationEndpoints", "Destinations", "build_crm",
           "build_mail", "build_tenant_crm", "build_tenant_mail", "resolve_secret"]


@dataclass(frozen=True)
class DestinationEndpoints:
    """A tenant's CRM and mail as one process would call them: provider names and base URLs
    ("" where a client names none or cannot be built). No credentials."""

    tenant: str
    crm_provider: str
    crm_url: str
    mail_provider: str
    mail_url: str


def build_crm(settings: Settings) -> CrmClient:
    """The global CRM client (`INBOXCRM_CRM_PROVIDER`)."""
    client: CrmClient = crm_provider(settings.crm_provider).from_settings(settings)
    return client


def build_mail(settings: Settings) -> MailClient:
    """The global mail client (`INBOXCRM_MAIL_PROVIDER`)."""
    client: MailClient = mail_provider(settings.mail_provider).from_settings(settings)
    return client


def _tenant_secrets(tenant: str, kind: str, spec: ProviderDestination,
                    settings: Settings) -> Secrets:
    """The block checked against the rules (again: the policy load did, but a destination
    may come from elsewhere), and its secrets' reader, bound to the tenant."""
    rules = settings.destination_rules()
    try:
        check_block(tenant, kind, spec, rules)
    except DestinationRefused as exc:
        raise ConfigurationError(f"tenant {tenant!r} {exc}") from None
    return Secrets(f"tenant {tenant!r} destinations.{kind}", tenant, rules)


def build_tenant_crm(tenant: str, spec: CrmDestination, settings: Settings) -> CrmClient:
    """A tenant's own CRM client from its policy (unset details: the global settings')."""
    secrets = _tenant_secrets(tenant, "crm", spec, settings)
    client: CrmClient = crm_provider(spec.provider, f"{secrets.what}.provider").for_tenant(
        spec, settings, secrets)
    return client


def build_tenant_mail(tenant: str, spec: MailDestination, settings: Settings) -> MailClient:
    """A tenant's own mail client. Its From is the policy's `sender.from`, given per message
    (`OutgoingEmail.sender`); INBOXCRM_MAIL_FROM stays the fallback."""
    secrets = _tenant_secrets(tenant, "mail", spec, settings)
    client: MailClient = mail_provider(spec.provider, f"{secrets.what}.provider").for_tenant(
        spec, settings, secrets)
    return client


class Destinations:
    """Each tenant's CRM and mail clients: its own where its policy names them, else the
    global ones. Built on first use and cached by tenant and configuration, so a policy
    edit takes effect without a restart and an unchanged tenant keeps its connections
    (and its Salesforce access token)."""

    def __init__(self, settings: Settings | None,
                 tenant_destinations: Callable[[str], TenantDestinations] | None = None, *,
                 crm: CrmClient | None = None, mail: MailClient | None = None) -> None:
        self._settings = settings
        self._lookup = tenant_destinations or (lambda tenant: TenantDestinations())
        self._default_crm = crm
        self._default_mail = mail
        self._crm: dict[tuple[str, str], CrmClient] = {}
        self._mail: dict[tuple[str, str], MailClient] = {}
        # Tenants not taken live: their CRM lacks the guarantee (`check_guarantees`).
        self._refused: dict[str, str] = {}

    @classmethod
    def fixed(cls, crm: CrmClient | None = None, mail: MailClient | None = None
              ) -> Destinations:
        """The same clients for every tenant (tests, tools that talk to one account)."""
        return cls(None, crm=crm, mail=mail)

    def _require_settings(self) -> Settings:
        if self._settings is None:
            raise ConfigurationError("no settings to build a destination from")
        return self._settings

    def global_crm(self) -> CrmClient:
        if self._default_crm is None:
            self._default_crm = build_crm(self._require_settings())
        return self._default_crm

    def global_mail(self) -> MailClient:
        if self._default_mail is None:
            self._default_mail = build_mail(self._require_settings())
        return self._default_mail

    def crm(self, tenant: str) -> CrmClient:
        if tenant in self._refused:
            raise ConfigurationError(f"tenant {tenant!r} not live: {self._refused[tenant]}")
        return self._account(tenant)

    def _account(self, tenant: str) -> CrmClient:
        spec = self._lookup(tenant).crm
        if spec is None:
            return self.global_crm()
        key = (tenant, spec.model_dump_json())
        if key not in self._crm:
            self._crm[key] = build_tenant_crm(tenant, spec, self._require_settings())
        return self._crm[key]

    async def check_guarantees(self, tenant: str) -> tuple[GuaranteeCheck, ...]:
        """The tenant's CRM's field definitions (`CrmGuarantee`); a failed check refuses the
        tenant (`crm` raises for it, so its items are blocked, never written to a CRM that
        could duplicate them) until a worker started after the fix checks again. A CRM that
        cannot be read (unreachable: `AdapterError`) raises and refuses nothing."""
        crm = self._account(tenant)
        if not isinstance(crm, CrmGuarantee):
            return ()
        checks = await crm.check_external_id()
        problems = [c.problem for c in checks if c.problem]
        if problems:
            self._refused[tenant] = problems[0]
        else:
            self._refused.pop(tenant, None)
        return checks

    def mail(self, tenant: str) -> MailClient:
        spec = self._lookup(tenant).mail
        if spec is None:
            return self.global_mail()
        key = (tenant, spec.model_dump_json())
        if key not in self._mail:
            self._mail[key] = build_tenant_mail(tenant, spec, self._require_settings())
        return self._mail[key]

    def endpoints(self, tenant: str) -> DestinationEndpoints:
        """Where this process would call for the tenant (providers and base URLs, never a
        secret): the worker reports it so `inboxcrm rehearse` can refuse a live destination.
        A destination that cannot be built is reported as such, with no URL."""
        found: dict[str, tuple[str, str]] = {}
        for kind, build in (("crm", self._account), ("mail", self.mail)):
            try:
                client = build(tenant)
            except (ConfigurationError, ValueError):
                found[kind] = ("unavailable", "")
                continue
            found[kind] = (client.name, str(getattr(client, "endpoint", "")))
        return DestinationEndpoints(tenant, *found["crm"], *found["mail"])

    async def aclose(self) -> None:
        clients: list[CrmClient | MailClient] = [*self._crm.values(), *self._mail.values()]
        clients += [c for c in (self._default_crm, self._default_mail) if c is not None]
        for client in clients:
            await client.aclose()

