"""The Gmail API source's settings (`INBOXCRM_GMAIL_*`, docs/mailboxes.md): where the API
is, and what a Pub/Sub push must prove to the relay (its OIDC token's issuer, keys,
audience and service account). Outside the local stack the issuer and its keys are
Google's and cannot be moved: a relay that trusted another issuer would take anyone's
push."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from inboxcrm.platform.config import Settings

GOOGLE_API_URL = "https://gmail.googleapis.com"
GOOGLE_ISSUERS = ("https://accounts.google.com", "accounts.google.com")
GOOGLE_JWKS_URL = "https://www.googleapis.com/oauth2/v3/certs"
# The local stack's push credential: what the sandbox's push subscription is told to sign.
LOCAL_PUSH_AUDIENCE = "inboxcrm-local-gmail-push"
LOCAL_PUSH_SERVICE_ACCOUNT = "gmail-push@inboxcrm-local.iam.gserviceaccount.com"


class UntrustedIssuer(RuntimeError):
    """An OIDC issuer other than Google's outside INBOXCRM_ENV=local."""


class GmailSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INBOXCRM_GMAIL_", extra="ignore")

    # The API root (the local stack: the sandbox).
    api_url: str | None = None
    # The push subscription's OIDC token: its `aud` and its `email` (the subscription's
    # service account). Unset outside the local stack: every push is refused (401).
    push_audience: str | None = None
    push_service_account: str | None = None
    # Only with INBOXCRM_ENV=local: the sandbox signs its pushes.
    push_issuer: str | None = None
    push_jwks_url: str | None = None
    # How long the relay keeps the issuer's keys before it asks again.
    jwks_cache_seconds: float = 3600.0
    # A watch is renewed when less than this is left of its 7 days.
    renew_before_seconds: float = 86400.0
    # The bounded full sync after an expired historyId (and on the first catch-up): at most
    # this many of the newest INBOX messages are matched by message ID.
    full_sync_max_messages: int = 500
    # The watcher catches up at least this often without a push (a push lost by Pub/Sub).
    poll_seconds: float = 300.0
    # The Pub/Sub topic a new registration's watch publishes to when none is given.
    topic: str | None = None

    def resolved(self, settings: Settings) -> GmailSettings:
        """Defaults filled in: the sandbox on the local stack, Google elsewhere."""
        local = settings.env == "local"
        if not local and (self.push_issuer not in (None, *GOOGLE_ISSUERS)
                          or self.push_jwks_url not in (None, GOOGLE_JWKS_URL)):
            raise UntrustedIssuer("INBOXCRM_GMAIL_PUSH_ISSUER / _JWKS_URL other than "
                                  "Google's only with INBOXCRM_ENV=local")
        sandbox = settings.sandbox_url.rstrip("/")
        return self.model_copy(update={
            "api_url": (self.api_url or (sandbox if local else GOOGLE_API_URL)).rstrip("/"),
            "push_issuer": self.push_issuer or (sandbox if local else GOOGLE_ISSUERS[0]),
            "push_jwks_url": self.push_jwks_url or (
                f"{sandbox}/oauth2/v3/certs" if local else GOOGLE_JWKS_URL),
            "push_audience": self.push_audience or (LOCAL_PUSH_AUDIENCE if local else None),
            "push_service_account": self.push_service_account or (
                LOCAL_PUSH_SERVICE_ACCOUNT if local else None),
        })

    def issuers(self) -> tuple[str, ...]:
        issuer = self.push_issuer or GOOGLE_ISSUERS[0]
        return GOOGLE_ISSUERS if issuer in GOOGLE_ISSUERS else (issuer,)
