"""Build the CRM and mail adapters: the global ones from settings, and each tenant's own
from its policy (`Destinations`, the worker's only constructor; docs/architecture.md §5).

`INBOXCRM_CRM_PROVIDER`:  sandbox (default) | hubspot | salesforce
`INBOXCRM_MAIL_PROVIDER`: sandbox (default) | resend | smtp

The sandbox is HubSpot-compatible and Resend-compatible, so `sandbox` uses those adapters
against `INBOXCRM_SANDBOX_URL` (or `INBOXCRM_CRM_URL` / `INBOXCRM_MAIL_URL` when set). A
real provider without its URL gets the provider's public API; a provider whose settings are
incomplete is an error at start-up, never a silent fallback to the sandbox.

A tenant whose policy names its own `destinations.crm` / `destinations.mail` gets clients
of its own, built on first use and kept (one per tenant and configuration); a tenant that
names none uses the global ones. A tenant's destination that cannot be built (a secret
reference that resolves to nothing) is an error for that tenant's items only, never a
fallback to another account.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from inboxcrm.adapters.base import CrmClient, MailClient
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.resend import ResendMail
from inboxcrm.adapters.salesforce import ClientCredentials, SalesforceCrm
from inboxcrm.adapters.smtp import SmtpMail
from schemas.destinations import CrmDestination, MailDestination, SecretRef, TenantDestinations

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings

CRM_PROVIDERS = ("sandbox", "hubspot", "salesforce")
MAIL_PROVIDERS = ("sandbox", "resend", "smtp")
HUBSPOT_API = "https://api.hubapi.com"
RESEND_API = "https://api.resend.com"


class ConfigurationError(ValueError):
    """The destination settings are incomplete or contradictory (says which variable)."""


def _secret(value: object) -> str | None:
    """A plain or pydantic SecretStr setting as text (None when unset or empty)."""
    if value is None:
        return None
    get = getattr(value, "get_secret_value", None)
    text = get() if callable(get) else value
    return str(text) or None


def build_crm(settings: Settings) -> CrmClient:
    provider = settings.crm_provider
    timeout = settings.http_timeout_seconds
    if provider == "sandbox":
        return HubSpotCrm(settings.crm_url or settings.sandbox_url, _secret(settings.crm_token),
                          settings.crm_id_property, timeout)
    if provider == "hubspot":
        token = _secret(settings.crm_token)
        if not token:
            raise ConfigurationError("INBOXCRM_CRM_TOKEN is required for the hubspot provider")
        return HubSpotCrm(settings.crm_url or HUBSPOT_API, token, settings.crm_id_property,
                          timeout)
    if provider == "salesforce":
        if not settings.salesforce_instance_url:
            raise ConfigurationError(
                "INBOXCRM_SALESFORCE_INSTANCE_URL is required for the salesforce provider")
        oauth = None
        client_secret = _secret(settings.salesforce_client_secret)
        if settings.salesforce_client_id or client_secret:
            if not (settings.salesforce_client_id and client_secret):
                raise ConfigurationError("INBOXCRM_SALESFORCE_CLIENT_ID and "
                                         "INBOXCRM_SALESFORCE_CLIENT_SECRET go together")
            oauth = ClientCredentials(
                settings.salesforce_token_url
                or f"{settings.salesforce_instance_url.rstrip('/')}/services/oauth2/token",
                settings.salesforce_client_id, client_secret, timeout)
        return SalesforceCrm(
            settings.salesforce_instance_url, _secret(settings.salesforce_token),
            external_id_field=settings.salesforce_external_id_field,
            company_field=settings.salesforce_company_field,
            note_external_id_field=settings.salesforce_note_external_id_field,
            api_version=settings.salesforce_api_version, timeout=timeout, oauth=oauth,
        )
    raise ConfigurationError(
        f"INBOXCRM_CRM_PROVIDER must be one of {', '.join(CRM_PROVIDERS)}, got {provider!r}")


def build_mail(settings: Settings) -> MailClient:
    provider = settings.mail_provider
    timeout = settings.http_timeout_seconds
    if provider == "sandbox":
        return ResendMail(settings.mail_url or settings.sandbox_url, _secret(settings.mail_token),
                          settings.mail_from, timeout)
    if provider == "resend":
        token = _secret(settings.mail_token)
        if not token:
            raise ConfigurationError("INBOXCRM_MAIL_TOKEN is required for the resend provider")
        return ResendMail(settings.mail_url or RESEND_API, token, settings.mail_from, timeout)
    if provider == "smtp":
        if not settings.smtp_host:
            raise ConfigurationError("INBOXCRM_SMTP_HOST is required for the smtp provider")
        return SmtpMail(
            settings.smtp_host, settings.smtp_port, sender=settings.mail_from,
            security=settings.smtp_tls, username=settings.smtp_username,
            password=_secret(settings.smtp_password), timeout=settings.smtp_timeout_seconds,
        )
    raise ConfigurationError(
        f"INBOXCRM_MAIL_PROVIDER must be one of {', '.join(MAIL_PROVIDERS)}, got {provider!r}")


def resolve_secret(ref: SecretRef, what: str) -> str:
    """The secret a policy refers to, read now. The error names where it was looked for,
    never a value."""
    if ref.env is not None:
        value = os.environ.get(ref.env, "")
    else:
        try:
            value = Path(str(ref.file)).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"{what}: cannot read {ref.describe()}: "
                                     f"{getattr(exc, 'strerror', None) or type(exc).__name__}"
                                     ) from None
    if not value:
        raise ConfigurationError(f"{what}: {ref.describe()} is empty or not set")
    return value


def _optional(ref: SecretRef | None, what: str) -> str | None:
    return resolve_secret(ref, what) if ref is not None else None


def build_tenant_crm(tenant: str, spec: CrmDestination, settings: Settings) -> CrmClient:
    """A tenant's own CRM client from its policy (unset details: the global settings')."""
    what = f"tenant {tenant!r} destinations.crm"
    timeout = settings.http_timeout_seconds
    token = _optional(spec.token, f"{what}.token")
    if spec.provider == "salesforce":
        assert spec.url is not None  # the policy requires it
        oauth = None
        if spec.oauth is not None:
            client_id = (spec.oauth.client_id if isinstance(spec.oauth.client_id, str)
                         else resolve_secret(spec.oauth.client_id, f"{what}.oauth.client_id"))
            oauth = ClientCredentials(
                spec.oauth.token_url or f"{spec.url.rstrip('/')}/services/oauth2/token",
                client_id, resolve_secret(spec.oauth.client_secret,
                                          f"{what}.oauth.client_secret"), timeout)
        return SalesforceCrm(
            spec.url, token,
            external_id_field=spec.external_id_field or settings.salesforce_external_id_field,
            company_field=(spec.company_field if spec.company_field is not None
                           else settings.salesforce_company_field),
            note_external_id_field=(spec.note_external_id_field
                                    or settings.salesforce_note_external_id_field),
            api_version=spec.api_version or settings.salesforce_api_version, timeout=timeout,
            oauth=oauth)
    default_url = settings.sandbox_url if spec.provider == "sandbox" else HUBSPOT_API
    return HubSpotCrm(spec.url or default_url, token,
                      spec.id_property or settings.crm_id_property, timeout)


def build_tenant_mail(tenant: str, spec: MailDestination, settings: Settings) -> MailClient:
    """A tenant's own mail client. Its From is the policy's `sender.from`, given per message
    (`OutgoingEmail.sender`); INBOXCRM_MAIL_FROM stays the fallback."""
    what = f"tenant {tenant!r} destinations.mail"
    if spec.provider == "smtp":
        assert spec.smtp_host is not None  # the policy requires it
        return SmtpMail(spec.smtp_host, spec.smtp_port, sender=settings.mail_from,
                        security=spec.smtp_tls, username=spec.smtp_username,
                        password=_optional(spec.smtp_password, f"{what}.smtp_password"),
                        timeout=settings.smtp_timeout_seconds)
    default_url = settings.sandbox_url if spec.provider == "sandbox" else RESEND_API
    return ResendMail(spec.url or default_url, _optional(spec.token, f"{what}.token"),
                      settings.mail_from, settings.http_timeout_seconds)


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
        spec = self._lookup(tenant).crm
        if spec is None:
            return self.global_crm()
        key = (tenant, spec.model_dump_json())
        if key not in self._crm:
            self._crm[key] = build_tenant_crm(tenant, spec, self._require_settings())
        return self._crm[key]

    def mail(self, tenant: str) -> MailClient:
        spec = self._lookup(tenant).mail
        if spec is None:
            return self.global_mail()
        key = (tenant, spec.model_dump_json())
        if key not in self._mail:
            self._mail[key] = build_tenant_mail(tenant, spec, self._require_settings())
        return self._mail[key]

    async def aclose(self) -> None:
        clients: list[CrmClient | MailClient] = [*self._crm.values(), *self._mail.values()]
        clients += [c for c in (self._default_crm, self._default_mail) if c is not None]
        for client in clients:
            await client.aclose()

