"""Typed settings: `INBOXCRM_*` environment variables; DATABASE_URL and TEMPORAL_ADDRESS keep
their usual names. One object, read once per process."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inboxcrm.schemas.contract import DEFAULT_TASK_QUEUE
from inboxcrm.schemas.destinations import DestinationRules, tenant_env_suffix
from inboxcrm.schemas.sources import SOURCE_NAMES, SourceName

ROOT = Path(__file__).resolve().parents[2]  # the repository (or install) root
# Per-tenant Standard Webhooks secrets: INBOXCRM_WEBHOOK_SECRET_<TENANT> (tenant upper-cased,
# `-` written as `_`), each bound to that one tenant (docs/architecture.md §7).
TENANT_SECRET_PREFIX = "INBOXCRM_WEBHOOK_SECRET_"
# Below this many bytes a credential refuses to start outside the local stack (INBOXCRM_ENV):
# 32 characters of base64 or hex are 192 / 128 bits, past any online guessing.
MIN_SECRET_BYTES = 32
# Each inbound source's key material: the Settings fields holding it (a `whsec_` secret is
# read without its prefix). One entry per name of schemas.sources (a missing one fails every
# start); the per-tenant Standard Webhooks secrets are added to "standard" in
# `inbound_secrets`.
SOURCE_SECRETS: dict[SourceName, tuple[str, ...]] = {
    "standard": ("webhook_secret",),
    "postmark": ("postmark_password",),
    "mailgun": ("mailgun_signing_key",),
}
# Credentials that are not an inbound source's, held to the same length rule.
OTHER_SECRETS = ("unsubscribe_secret", "review_token", "codec_token", "decision_secret")
# The demo tenant's sender: the From of the local stack when INBOXCRM_MAIL_FROM is unset.
LOCAL_MAIL_FROM = "Acme Sales <sales@acme.test>"


class InsecureSetting(RuntimeError):
    """A credential too short to run with outside the local stack. Not a ValueError on
    purpose: pydantic would wrap that with the input values, secrets included."""


class MissingSetting(InsecureSetting):
    """A setting production must be given (it has a default only on the local stack). An
    InsecureSetting, so whatever refuses to start on one refuses on this too."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INBOXCRM_", extra="ignore")

    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:55432/postgres",
        validation_alias=AliasChoices("DATABASE_URL", "INBOXCRM_DATABASE_URL"),
    )
    # Each process switches to its kind's database role on every connection (SET ROLE
    # inboxcrm_relay / _desk / _worker / _operator, inboxcrm/store/roles.py), and the
    # migration runner creates those roles and their grants. false: for a database where the
    # migration user may not create roles; every process then has its login user's
    # privileges (docs/architecture.md §7, Database roles).
    db_role: bool = True
    temporal_address: str = Field(
        "127.0.0.1:7233",
        validation_alias=AliasChoices("TEMPORAL_ADDRESS", "INBOXCRM_TEMPORAL_ADDRESS"),
    )
    temporal_namespace: str = "default"
    # One Temporal namespace per tenant (docs/architecture.md §7, Namespaces): an operator
    # setting, never a tenant policy's. Comma-separated `tenant=namespace` entries and/or one
    # template with `{tenant}` (e.g. `inboxcrm-{tenant}`); a tenant named nowhere (or
    # everyone, when empty) stays in the shared namespace above. Parsed and checked by
    # inboxcrm/platform/temporal.py `tenant_namespaces`.
    tenant_namespaces: str = ""
    # The namespaces this worker polls (comma-separated); empty: the shared one and every
    # tenant's (inboxcrm/worker.py).
    worker_namespaces: str = ""
    task_queue: str = DEFAULT_TASK_QUEUE
    # A Temporal client profile (temporal.toml, the format the Temporal CLI and SDKs share,
    # read by temporalio.envconfig): TEMPORAL_CONFIG_FILE names the file, TEMPORAL_PROFILE the
    # profile in it (default "default"). Read only when one of them is set. The standard
    # TEMPORAL_* variables override the profile, the INBOXCRM_* settings here override both
    # (inboxcrm/platform/temporal.py connect_config).
    temporal_config_file: str | None = Field(
        None,
        validation_alias=AliasChoices("TEMPORAL_CONFIG_FILE", "INBOXCRM_TEMPORAL_CONFIG_FILE"))
    temporal_profile: str | None = Field(
        None, validation_alias=AliasChoices("TEMPORAL_PROFILE", "INBOXCRM_TEMPORAL_PROFILE"))
    # Temporal Cloud / TLS (inboxcrm/platform/temporal.py connect): mTLS client certificate and key
    # (PEM file paths), optional server CA, or an API key (implies TLS).
    temporal_tls_cert: str | None = None
    temporal_tls_key: str | None = None
    temporal_tls_ca: str | None = None
    temporal_tls_server_name: str | None = None
    temporal_api_key: SecretStr | None = None

    # `local`: the stack `inboxcrm up` and the tests run (short credentials allowed).
    # Anything else is treated as production: every inbound credential and token that is
    # set must be at least MIN_SECRET_BYTES long, or the process refuses to start.
    env: Literal["local", "production"] = "production"

    # Relay
    relay_host: str = "127.0.0.1"
    relay_port: int = 8080
    # Standard Webhooks secret (`whsec_<base64>`) shared by the tenants whose policy lists
    # "standard" in `inbound_credentials`. Empty: no shared secret (there is no built-in one).
    webhook_secret: str = ""
    # Per-tenant secrets, each bound to its one tenant: {tenant: secret}. Filled from
    # INBOXCRM_WEBHOOK_SECRET_<TENANT> variables (see `_tenant_secrets_from_environment`).
    webhook_tenant_secrets: dict[str, str] = Field(default_factory=dict)
    webhook_tolerance_seconds: int = 300
    max_body_bytes: int = 10 * 1024 * 1024
    sweeper_interval_seconds: float = 5.0
    # How often the relay looks for runs that ended without settling their item (failed,
    # terminated, timed out, cancelled) to write them `failed` into the queue; how far back
    # its first pass looks.
    failed_run_check_seconds: float = 30.0
    failed_run_lookback_hours: float = 168.0
    relay_pool_size: int = 20
    # The relay's Prometheus metrics: an internal listener, never the public port; empty
    # disables it. Store gauges are refreshed every interval, not per scrape.
    relay_metrics_address: str = "127.0.0.1:9465"
    relay_metrics_interval_seconds: float = Field(15.0, gt=0)

    # Provider sources and one-click unsubscribe (inboxcrm/ingress/).
    # Unset credentials disable the source (every request is a 401 without reading the body);
    # `inboxcrm up` generates them under .data/. A credential writes only into the tenants
    # whose policy lists it (`inbound_credentials`: "postmark", "mailgun").
    # Unset unsubscribe secret: no follow-up is sent (every follow-up carries its opt-out
    # link; the send is blocked `unsubscribe_secret_missing`), links 404.
    postmark_user: str | None = None
    postmark_password: SecretStr | None = None
    mailgun_signing_key: SecretStr | None = None
    mailgun_tolerance_seconds: int = 300
    unsubscribe_secret: SecretStr | None = None
    public_relay_url: str | None = None  # default: http://{relay_host}:{relay_port}
    # The review desk (GET /review/, /review/{workflow_id}): the operator's all-tenant token
    # (bearer or login form; recorded as `operator`). Reviewers have personal tokens
    # (`inboxcrm reviewer add`) or sign on through the OIDC issuer below.
    review_token: SecretStr | None = None
    review_session_hours: float = 12.0
    # A desk session without a request for this long ends (server-side, `review_sessions`).
    review_session_idle_minutes: float = Field(30.0, gt=0)
    # Reviewers as people (docs/architecture.md §6, §7): the server-side secret that proves a
    # decision came from the desk or the CLI with an authenticated reviewer (relay, worker and
    # CLI share it), and keys the desk's sessions and CSRF tokens. Unset: the desk is read-only
    # and every decision is recorded as unproven.
    decision_secret: SecretStr | None = None
    # Whether Temporal itself authenticates its users and scopes what they may signal or
    # update (Temporal Cloud's namespace roles, a server authorizer), so that a decision sent
    # with a plain Temporal client is a person's. False (the default): with
    # INBOXCRM_ENV=production a decision without the desk's or the CLI's proof is refused
    # (docs/architecture.md §6, "Decisions from Temporal clients"). True keeps them,
    # recorded as unproven with Temporal's identity of the request.
    temporal_authorizes_decisions: bool = False
    # Single sign-on (the desk's bearer tokens and the codec endpoint): an OIDC issuer whose
    # published keys (JWKS from its discovery document, cached) sign access tokens for this
    # audience; the tenants a person may review are listed in the tenants claim.
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_tenants_claim: str = "inboxcrm_tenants"
    oidc_jwks_cache_seconds: float = 600.0

    # Destinations (the sandbox by default)
    sandbox_url: str = "http://127.0.0.1:8090"
    crm_url: str | None = None
    crm_token: str | None = None
    crm_id_property: str = "inboxcrm_contact_id"
    mail_url: str | None = None
    mail_token: str | None = None
    # The From of tenants whose policy sets no sender.from (docs/architecture.md §5). Unset,
    # the local stack mails as its demo tenant; anywhere else it must be set, or the process
    # refuses to start (a real tenant must never mail as the demo company).
    mail_from: str = ""
    http_timeout_seconds: float = 10.0
    # A tenant's own destinations (schemas/destinations.py): the hosts beyond each provider's
    # documented ones a policy may name (comma-separated names, `*.domain`, IP addresses or
    # networks; these may be plain http and internal addresses: the local stack lists its
    # loopback sandbox), and the directory whose `<tenant>/` holds that tenant's secret
    # files (unset: tenants' secrets come only from INBOXCRM_TENANT_<TENANT>_* variables).
    destination_hosts_allowed: str = ""
    tenant_secrets_dir: str | None = None
    # A provider's Retry-After up to this is waited out by the step's own retry (an attempt
    # spent); longer, the operation parks until then, spending none (docs/architecture.md §4)
    # up to max_park_seconds; a delay longer than that blocks the item for a person.
    max_retry_after_seconds: float = 300.0
    max_park_seconds: float = 86_400.0
    # Which adapters the worker builds: a provider of the registry
    # (inboxcrm/adapters/registry.py; an unknown name stops the worker at start, naming the
    # known ones). `sandbox` is the HubSpot/Resend-compatible sandbox at sandbox_url (or
    # crm_url / mail_url).
    crm_provider: str = "sandbox"
    mail_provider: str = "sandbox"
    # Salesforce (inboxcrm/adapters/salesforce.py): upsert by External ID on Contact.
    salesforce_instance_url: str | None = None  # e.g. https://acme.my.salesforce.com
    salesforce_token: SecretStr | None = None   # a fixed access token (Bearer; not renewed)
    # OAuth 2.0 client credentials flow (preferred): the adapter fetches its own token from
    # the token URL (default {instance}/services/oauth2/token) and renews it on
    # INVALID_SESSION_ID. Per tenant: the policy's destinations.crm.oauth.
    salesforce_client_id: str | None = None
    salesforce_client_secret: SecretStr | None = None
    salesforce_token_url: str | None = None
    salesforce_api_version: str = "62.0"
    salesforce_external_id_field: str = "Inboxcrm_Contact_Id__c"  # External ID + Unique
    salesforce_company_field: str = "Inboxcrm_Company__c"  # text field; "" sends no company
    salesforce_note_external_id_field: str = "Inboxcrm_Note_Id__c"  # on Activity (Task)
    # SMTP (inboxcrm/adapters/smtp.py): not reconcilable, unknown outcomes are held.
    smtp_host: str | None = None
    smtp_port: int = 587
    smtp_tls: Literal["starttls", "ssl", "none"] = "starttls"
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_timeout_seconds: float = 30.0

    # Extraction
    extractor: str = "rules"
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    llm_model: str = "gpt-4o-mini"
    llm_timeout_seconds: float = 30.0
    llm_max_schema_retries: int = 2
    # With the LLM extractor the model call is a regular activity on its own task queue
    # (empty: `<task_queue>-model`), rate-limited for every worker on it together (Temporal's
    # task-queue limit) and bounded per worker (docs/architecture.md §5).
    model_task_queue: str = ""
    model_calls_per_second: float = 5.0
    model_max_concurrent: int = 20

    # The work budget of one message (docs/architecture.md §7, inboxcrm/platform/workpool.py):
    # extraction (worker) and the review card's minimising (relay) run in child processes,
    # each call killed after work_time_limit_seconds of wall clock (the child is replaced)
    # or at work_memory_limit_mb of address space (0: no limit). A message over budget
    # goes to review as `too_complex`.
    work_processes: int = Field(1, ge=1, le=64)  # per worker process (one per core is a worker)
    relay_work_processes: int = Field(1, ge=1, le=64)
    work_time_limit_seconds: float = Field(5.0, gt=0, le=60)
    work_memory_limit_mb: int = Field(384, ge=0)  # a child starts at ~90 MB of it

    # Worker. Prometheus metrics (SDK + app) at this address; empty disables.
    worker_metrics_address: str = "127.0.0.1:9464"
    max_concurrent_activities: int = 50
    # Items in a worker at once: an item's steps are local activities that run inside its
    # workflow task, which holds its slot until the item's end, and inside a worker they are
    # served first come, first served. A small count keeps a burst's backlog at the Temporal
    # server, where task-queue fairness orders it per tenant (docs/capacity.md "Fair across
    # tenants", issue 38; measured with `make bench-neighbour`). 6 per worker (one core).
    max_concurrent_workflow_tasks: int = 6
    # Above 0: the item slots follow the machine's CPU instead (Temporal's resource-based
    # slot supplier): at least min_concurrent_workflow_tasks, at most
    # max_concurrent_workflow_tasks, one more only while the system's CPU is under this
    # share. On a busy core it stays near the minimum, so an item shares its core with few
    # others; with items waiting on slow providers it grows (docs/capacity.md).
    workflow_task_target_cpu: float = Field(0.0, ge=0.0, le=1.0)
    min_concurrent_workflow_tasks: int = Field(2, ge=1)
    max_cached_workflows: int = 250
    # The SDK's workflow sandbox re-executes the workflow module and proxies its imports for
    # every workflow run: about 15 ms of CPU per item on a 2-core machine, a sixth of an
    # item's whole cost (docs/capacity.md). Off by default; determinism is guarded by the
    # replay tests, which run the histories through the sandboxed Replayer (inboxcrm/worker.py).
    workflow_sandbox: bool = False
    # SIGTERM: stop polling, let in-flight steps finish for up to this long (≥ the longest
    # step, 45 s), then cancel. deploy/k8s/base/worker.yaml's terminationGracePeriodSeconds (75)
    # leaves room for it plus closing connections (tests/fast/test_deploy_config.py).
    shutdown_grace_seconds: float = 50.0

    # Scheduled drift check (inboxcrm/workflows/drift_check.py): every interval, a sample of the
    # operations completed in the last window is checked at the destination.
    drift_check_interval_seconds: int = Field(3600, ge=60)
    drift_check_window_seconds: int = Field(86_400, ge=60)
    drift_check_sample_size: int = Field(200, ge=1, le=10_000)
    # Review notices (inboxcrm/workflows/review_notices.py): how often the tenants' reviewers are
    # told about new and overdue review tasks (one message per tenant per run at most,
    # unless a backlog needs several).
    review_notice_interval_seconds: int = Field(60, ge=5, le=86_400)
    # How often the scheduled consent sync writes inboxcrm's own opt-outs to the CRMs'
    # opt-out fields (docs/consent.md); a failed write waits for its backoff, not this.
    consent_sync_interval_seconds: int = Field(15, ge=1, le=86_400)
    # How often the scheduled retention run applies the tenants' policy `retention` periods
    # (inboxcrm/workflows/retention.py); a run removes at most a bounded amount per tenant.
    retention_interval_seconds: int = Field(86_400, ge=60, le=7 * 86_400)

    # Payload encryption (docs/architecture.md §7; inboxcrm/platform/codec.py).
    # No key file: codec off.
    codec_keys_file: str | None = None
    codec_token: SecretStr | None = None
    codec_cors_origins: str = "http://127.0.0.1:8233,http://localhost:8233"
    codec_namespaces: str | None = None  # comma-separated; default: temporal_namespace

    @model_validator(mode="after")
    def _tenant_secrets_from_environment(self) -> Settings:
        """INBOXCRM_WEBHOOK_SECRET_<TENANT> variables (pydantic-settings has no pattern
        fields); an explicit `webhook_tenant_secrets` entry wins."""
        for name, value in os.environ.items():
            if name.startswith(TENANT_SECRET_PREFIX) and value:
                suffix = name[len(TENANT_SECRET_PREFIX):]
                known = {tenant_env_suffix(t) for t in self.webhook_tenant_secrets}
                if suffix and suffix not in known:
                    self.webhook_tenant_secrets[suffix.lower()] = value
        return self

    @model_validator(mode="after")
    def _refuse_short_secrets(self) -> Settings:
        """Outside the local stack a guessable credential is refused at start, never used
        (the message names the setting, never the value)."""
        if self.env == "local":
            return self
        for name, value in self.inbound_secrets().items():
            if len(value.encode()) < MIN_SECRET_BYTES:
                raise InsecureSetting(f"{name} is shorter than {MIN_SECRET_BYTES} bytes; generate "
                                 "one with `openssl rand -base64 32` (short values are only "
                                 "allowed with INBOXCRM_ENV=local)")
        return self

    @model_validator(mode="after")
    def _demo_sender_only_locally(self) -> Settings:
        """The demo tenant's From is a default of the local stack only: outside it an unset
        INBOXCRM_MAIL_FROM refuses to start (the message names the variable)."""
        if self.mail_from.strip():
            return self
        if self.env == "local":
            self.mail_from = LOCAL_MAIL_FROM
            return self
        raise MissingSetting("INBOXCRM_MAIL_FROM is not set: it is the From of every tenant "
                             "whose policy sets no sender.from, e.g. INBOXCRM_MAIL_FROM="
                             "'Sales <sales@example.com>' (the demo sender is only the "
                             "default with INBOXCRM_ENV=local)")

    @property
    def refuses_unproven_decisions(self) -> bool:
        """In production a decision must carry a proof, unless Temporal authorises its
        users' decisions itself."""
        return self.env == "production" and not self.temporal_authorizes_decisions

    def inbound_secrets(self) -> dict[str, str]:
        """The credentials this deployment accepts or signs with, by variable name, as their
        key material (a `whsec_` secret without its prefix). Unset ones are left out."""
        out: dict[str, str] = {}
        for source in SOURCE_NAMES:
            for name in SOURCE_SECRETS[source]:
                out.update(self._secret(name))
            if source == "standard":
                for tenant, secret in self.webhook_tenant_secrets.items():
                    out[TENANT_SECRET_PREFIX + tenant_env_suffix(tenant)] = \
                        secret.removeprefix("whsec_")
        for name in OTHER_SECRETS:
            out.update(self._secret(name))
        return out

    def _secret(self, field: str) -> dict[str, str]:
        """{variable: key material} of one credential field, or {} when it is unset."""
        value = getattr(self, field)
        if isinstance(value, SecretStr):
            text = value.get_secret_value()
        else:  # the Standard Webhooks secret: `whsec_<base64>`
            text = (value or "").removeprefix("whsec_")
        return {f"INBOXCRM_{field.upper()}": text} if text else {}

    def destination_rules(self) -> DestinationRules:
        return DestinationRules.parse(self.destination_hosts_allowed, self.tenant_secrets_dir)

    @property
    def crm_base_url(self) -> str:
        return self.crm_url or self.sandbox_url

    @property
    def mail_base_url(self) -> str:
        return self.mail_url or self.sandbox_url

    @property
    def public_relay_base_url(self) -> str:
        return (self.public_relay_url or f"http://{self.relay_host}:{self.relay_port}").rstrip("/")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
