"""Build the configured CRM and mail adapters from settings (the worker's only constructor).

`INBOXCRM_CRM_PROVIDER`:  sandbox (default) | hubspot | salesforce
`INBOXCRM_MAIL_PROVIDER`: sandbox (default) | resend | smtp

The sandbox is HubSpot-compatible and Resend-compatible, so `sandbox` uses those adapters
against `INBOXCRM_SANDBOX_URL` (or `INBOXCRM_CRM_URL` / `INBOXCRM_MAIL_URL` when set). A
real provider without its URL gets the provider's public API; a provider whose settings are
incomplete is an error at start-up, never a silent fallback to the sandbox.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inboxcrm.adapters.base import CrmClient, MailClient
from inboxcrm.adapters.hubspot import HubSpotCrm
from inboxcrm.adapters.resend import ResendMail
from inboxcrm.adapters.salesforce import SalesforceCrm
from inboxcrm.adapters.smtp import SmtpMail

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
        return SalesforceCrm(
            settings.salesforce_instance_url, _secret(settings.salesforce_token),
            external_id_field=settings.salesforce_external_id_field,
            company_field=settings.salesforce_company_field,
            note_external_id_field=settings.salesforce_note_external_id_field,
            api_version=settings.salesforce_api_version, timeout=timeout,
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
