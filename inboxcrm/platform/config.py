"""Typed settings: `INBOXCRM_*` environment variables; DATABASE_URL and TEMPORAL_ADDRESS keep
their usual names. One object, read once per process."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.contract import DEFAULT_TASK_QUEUE

ROOT = Path(__file__).resolve().parents[2]  # the repository (or install) root


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="INBOXCRM_", extra="ignore")

    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:55432/postgres",
        validation_alias=AliasChoices("DATABASE_URL", "INBOXCRM_DATABASE_URL"),
    )
    temporal_address: str = Field(
        "127.0.0.1:7233",
        validation_alias=AliasChoices("TEMPORAL_ADDRESS", "INBOXCRM_TEMPORAL_ADDRESS"),
    )
    temporal_namespace: str = "default"
    task_queue: str = DEFAULT_TASK_QUEUE
    # Temporal Cloud / TLS (inboxcrm/platform/temporal.py connect): mTLS client certificate and key
    # (PEM file paths), optional server CA, or an API key (implies TLS).
    temporal_tls_cert: str | None = None
    temporal_tls_key: str | None = None
    temporal_tls_ca: str | None = None
    temporal_tls_server_name: str | None = None
    temporal_api_key: SecretStr | None = None

    # Relay
    relay_host: str = "127.0.0.1"
    relay_port: int = 8080
    webhook_secret: str = "whsec_ZGV2LW9ubHktc2VjcmV0LWNoYW5nZS1tZS0xMjM0NTY3OA=="
    webhook_tolerance_seconds: int = 300
    max_body_bytes: int = 10 * 1024 * 1024
    sweeper_interval_seconds: float = 5.0
    relay_pool_size: int = 20

    # Provider sources and one-click unsubscribe (inboxcrm/ingress/).
    # Unset credentials disable the source (every request is a 401); `inboxcrm up` generates
    # them under .data/. Unset unsubscribe secret: no List-Unsubscribe header, links 404.
    postmark_user: str | None = None
    postmark_password: SecretStr | None = None
    mailgun_signing_key: SecretStr | None = None
    mailgun_tolerance_seconds: int = 300
    unsubscribe_secret: SecretStr | None = None
    public_relay_url: str | None = None  # default: http://{relay_host}:{relay_port}
    # The review card (GET /review/{workflow_id}): this bearer token, or a session cookie from
    # its login form. One operator token, not scoped to a tenant. Unset: every request 401.
    review_token: SecretStr | None = None
    review_session_hours: float = 12.0

    # Destinations (the sandbox by default)
    sandbox_url: str = "http://127.0.0.1:8090"
    crm_url: str | None = None
    crm_token: str | None = None
    crm_id_property: str = "inboxcrm_contact_id"
    mail_url: str | None = None
    mail_token: str | None = None
    mail_from: str = "Acme Sales <sales@acme.test>"
    http_timeout_seconds: float = 10.0
    max_retry_after_seconds: float = 300.0
    # Which adapters the worker builds (inboxcrm/adapters/factory.py). `sandbox` is the
    # HubSpot/Resend-compatible sandbox at sandbox_url (or crm_url / mail_url).
    crm_provider: Literal["sandbox", "hubspot", "salesforce"] = "sandbox"
    mail_provider: Literal["sandbox", "resend", "smtp"] = "sandbox"
    # Salesforce (inboxcrm/adapters/salesforce.py): upsert by External ID on Contact.
    salesforce_instance_url: str | None = None  # e.g. https://acme.my.salesforce.com
    salesforce_token: SecretStr | None = None   # OAuth access token (Bearer)
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
    max_concurrent_workflow_tasks: int = 50
    max_cached_workflows: int = 250
    # SIGTERM: stop polling, let in-flight steps finish for up to this long (≥ the longest
    # step, 45 s), then cancel. deploy/k8s/worker.yaml's terminationGracePeriodSeconds (75)
    # leaves room for it plus closing connections (tests/fast/test_deploy_config.py).
    shutdown_grace_seconds: float = 50.0

    # Scheduled drift check (workflows/drift_check.py): every interval, a sample of the
    # operations completed in the last window is checked at the destination.
    drift_check_interval_seconds: int = Field(3600, ge=60)
    drift_check_window_seconds: int = Field(86_400, ge=60)
    drift_check_sample_size: int = Field(200, ge=1, le=10_000)

    # Payload encryption (docs/architecture.md §7; inboxcrm/platform/codec.py).
    # No key file: codec off.
    codec_keys_file: str | None = None
    codec_token: SecretStr | None = None
    codec_cors_origins: str = "http://127.0.0.1:8233,http://localhost:8233"
    codec_namespaces: str | None = None  # comma-separated; default: temporal_namespace

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
