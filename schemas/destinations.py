"""A tenant's own destinations, as its policy file states them (`policies/README.md`).

The tenant policy (`inboxcrm.domain.policy`) validates this block when it loads; the adapter
factory (`inboxcrm.adapters.factory`) builds the tenant's clients from it. Both rooms read
these types, so they live here, below both (docs/architecture.md §9).

Secrets are given **by reference**, never inline: `{"env": "VAR"}` (an environment variable
of the worker) or `{"file": "/path"}` (a mounted secret file, its content stripped of
surrounding whitespace). A policy file holding a secret's value fails to load, and no error
message ever repeats what was written in a secret's place.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
INLINE_SECRET = ('a secret is given by reference ({"env": "VAR"} or {"file": "/path"}), '
                 "never inline in the policy file")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Strict):
    """Where a secret is read from when the destination is built: exactly one of the two."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError('give exactly one of "env" and "file"')
        if self.env is not None and not _ENV_NAME.match(self.env):
            raise ValueError("env must be an environment variable name")
        if self.file is not None and not self.file.startswith("/"):
            raise ValueError("file must be an absolute path")
        return self

    def describe(self) -> str:
        """Where the secret comes from (for error messages; never its value)."""
        return f"environment variable {self.env}" if self.env else f"file {self.file}"


def _no_inline(value: Any) -> Any:
    if value is not None and not isinstance(value, dict | SecretRef):
        raise ValueError(INLINE_SECRET)
    return value


class SalesforceOAuth(_Strict):
    """The OAuth 2.0 client credentials flow of a Salesforce connected app: the adapter
    fetches its own access token and renews it when Salesforce answers INVALID_SESSION_ID."""

    flow: Literal["client_credentials"] = "client_credentials"
    client_id: str | SecretRef  # the connected app's consumer key: not a secret by itself
    client_secret: SecretRef
    # Default: `{instance url}/services/oauth2/token` (the org's My Domain, where Salesforce
    # requires the client credentials flow to be called).
    token_url: str | None = None

    @field_validator("client_secret", mode="before")
    @classmethod
    def _by_reference(cls, value: Any) -> Any:
        return _no_inline(value)


class CrmDestination(_Strict):
    provider: Literal["sandbox", "hubspot", "salesforce"]
    # sandbox / hubspot: the API base URL (default: the global one); salesforce: the
    # instance URL (required).
    url: str | None = None
    # sandbox / hubspot: the private app token; salesforce: a fixed access token (no
    # renewal; prefer `oauth`).
    token: SecretRef | None = None
    id_property: str | None = None  # hubspot / sandbox: our unique contact property
    oauth: SalesforceOAuth | None = None
    external_id_field: str | None = None
    company_field: str | None = None
    note_external_id_field: str | None = None
    api_version: str | None = None

    @field_validator("token", mode="before")
    @classmethod
    def _by_reference(cls, value: Any) -> Any:
        return _no_inline(value)

    @field_validator("id_property", "external_id_field", "note_external_id_field")
    @classmethod
    def _field_name(cls, value: str | None) -> str | None:
        if value is not None and not _FIELD.match(value):
            raise ValueError("must be a field name (letters, digits, underscores)")
        return value

    @model_validator(mode="after")
    def _complete(self) -> CrmDestination:
        if self.provider == "salesforce":
            if not self.url:
                raise ValueError("a salesforce destination needs its instance url")
            if self.oauth is None and self.token is None:
                raise ValueError("a salesforce destination needs oauth (or a token)")
        elif self.oauth is not None:
            raise ValueError("oauth is for the salesforce provider")
        if self.provider == "hubspot" and self.token is None:
            raise ValueError("a hubspot destination needs its token")
        return self


class MailDestination(_Strict):
    provider: Literal["sandbox", "resend", "smtp"]
    url: str | None = None             # sandbox / resend API base URL
    token: SecretRef | None = None     # sandbox / resend API key
    smtp_host: str | None = None
    smtp_port: int = Field(587, ge=1, le=65535)
    smtp_tls: Literal["starttls", "ssl", "none"] = "starttls"
    smtp_username: str | None = None
    smtp_password: SecretRef | None = None

    @field_validator("token", "smtp_password", mode="before")
    @classmethod
    def _by_reference(cls, value: Any) -> Any:
        return _no_inline(value)

    @model_validator(mode="after")
    def _complete(self) -> MailDestination:
        if self.provider == "resend" and self.token is None:
            raise ValueError("a resend destination needs its token")
        if self.provider == "smtp" and not self.smtp_host:
            raise ValueError("an smtp destination needs smtp_host")
        return self


class TenantDestinations(_Strict):
    """Unset parts use the global settings (`INBOXCRM_CRM_PROVIDER`, `INBOXCRM_MAIL_*`)."""

    crm: CrmDestination | None = None
    mail: MailDestination | None = None
