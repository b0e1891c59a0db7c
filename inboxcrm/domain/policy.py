"""Tenant policy: one settings file per tenant in `policies/` (see `policies/README.md`),
and the tenant's own words in `policies/<tenant>/templates/`. Identity is a tenant policy,
never a model judgement.

A policy refuses to load, with a message naming the file, when it is invalid: an unknown
key, a secret written inline instead of by reference (`schemas.destinations`), a follow-up
rule whose template is missing, or a template that does not show the opt-out link and the
sender's postal address (`inboxcrm.domain.templates`)."""

from __future__ import annotations

import email.utils
import json
import os
import re
import time
import tomllib
from pathlib import Path
from typing import Any, Literal

from email_validator import EmailNotValidError, validate_email
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from temporalio.common import Priority

from inboxcrm.domain.templates import Template, TemplateRefused, load_templates, rule_version
from inboxcrm.schemas.destinations import (
    DestinationRefused,
    DestinationRules,
    SecretRef,
    TenantDestinations,
    check_destinations,
    check_secret,
    tenant_env_suffix,
)
from inboxcrm.schemas.models import (
    DEFAULT_CRM_RETRY,
    DEFAULT_SEND_RETRY,
    DEFAULT_URGENT_SEND_RETRY,
    RETRY_BACKOFF,
    RETRY_INITIAL_SECONDS,
    RETRY_MAX_ATTEMPTS,
    RETRY_MAXIMUM_SECONDS,
    StepRetry,
)
from inboxcrm.schemas.outcomes import OWNER_CAUSES
from inboxcrm.schemas.sources import SourceName

ROOT = Path(__file__).resolve().parents[2]
POLICY_SUFFIXES = (".json", ".toml")
KNOWN_FIELDS = ("name", "company")


class PolicyError(ValueError):
    """A policy file is missing, unreadable or invalid. The message names the file."""


class UnknownTenant(LookupError):
    """No policy file for this tenant."""

    def __init__(self, tenant: str) -> None:
        super().__init__(f"unknown tenant {tenant!r}: no policy file in {policy_dir()}")
        self.tenant = tenant


class InvalidAddress(ValueError):
    """An address failed validation. The message never contains the address."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SendPurpose = Literal["service", "marketing"]
SuppressionScope = Literal["all", "marketing"]
# The suppression reasons a policy may narrow to `marketing`; a bounce or an abuse report
# always stops every send (the address cannot, or must not, be written to).
NARROWABLE_SUPPRESSIONS = ("opt_out_request", "list_unsubscribe")


# The parts of a rendered follow-up an edited draft may name as fixed (`DraftLimits.keep`).
# The opt-out link and the postal address are fixed in every draft, named or not.
DraftPart = Literal["signature", "sender_name", "opt_out_url", "postal_address"]
ALWAYS_KEPT: tuple[DraftPart, ...] = ("opt_out_url", "postal_address")


class DraftLimits(_Strict):
    """What a reviewer may change in a follow-up held for approval (docs/architecture.md §6,
    "Edited drafts"): the edited plain text is at most `max_chars` characters and keeps,
    verbatim, the rendered value of each part in `keep` (and always the opt-out link and the
    postal address). Declared by the template (`<name>.draft.json`) and, narrowing it, by
    the rule (`draft`)."""

    max_chars: int = Field(default=4000, ge=1, le=20000)
    keep: list[DraftPart] = ["signature"]

    def fixed(self) -> tuple[DraftPart, ...]:
        """Every part a draft must keep, in a stable order."""
        return tuple(dict.fromkeys([*ALWAYS_KEPT, *self.keep]))

    def narrowed_by(self, other: DraftLimits | None) -> DraftLimits:
        """These limits and `other`'s together: the shorter length, every part either keeps."""
        if other is None:
            return self
        return DraftLimits(max_chars=min(self.max_chars, other.max_chars),
                           keep=list(dict.fromkeys([*self.keep, *other.keep])))


class FollowupRule(_Strict):
    rule_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    version: int = Field(ge=1)
    intents: list[str]
    quiet_period_hours: float = Field(default=24, ge=0)
    # The template's name in policies/<tenant>/templates/ (<name>.<lang>.subject|txt|html).
    template_id: str = Field(default="ack", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    new_prospect_requires_approval: bool = False
    # `known_customers`: sent automatically only to a contact that existed before this
    # message with a record in the CRM (created by us or adopted); anyone else's follow-up
    # waits for a person (`unknown_customer`). `always`: as the other settings say.
    auto_send: Literal["always", "known_customers"] = "always"
    # A reviewer may edit the follow-up held for approval within these limits; None: the
    # rendered words are approved or declined as they are.
    draft: DraftLimits | None = None
    # What the follow-up is (docs/consent.md): a `service` reply (the acknowledgment of an
    # inquiry the person sent) or `marketing`; a suppression of scope `marketing` stops only
    # the latter. The lawful basis is the consent record each send of the rule carries.
    purpose: SendPurpose = "service"
    lawful_basis: str = Field(default="reply_to_inquiry", pattern=r"^[a-z][a-z0-9_]{0,63}$")
    # How soon its follow-up must go out or reach a person: `urgent` sends with the policy's
    # `retries.urgent_send` (quick attempts, a person asked within about a minute), `normal`
    # with `retries.send`.
    urgency: Literal["normal", "urgent"] = "normal"

    @field_validator("intents")
    @classmethod
    def _known_intents(cls, intents: list[str]) -> list[str]:
        from inboxcrm.schemas.extraction import INTENTS

        unknown = sorted(set(intents) - set(INTENTS))
        if unknown:
            raise ValueError(f"unknown intents {unknown}; allowed: {list(INTENTS)}")
        return intents


class IdentityPolicy(_Strict):
    fold_dots: bool = False
    fold_plus: bool = False


class Thresholds(_Strict):
    """The confidence a field needs to be kept; below it the field is dropped and the message
    goes to review (`low_confidence:<field>`). Measured with `inboxcrm calibrate` on the
    labelled real-mail set (tests/fast/realmail/fields.jsonl); the table and its reading are
    in docs/calibration.md. Re-run it before changing a default."""

    # calibrated: precision 1.000, recall 0.978 at 0.8 (the same anywhere in 0.65-0.95; the
    # one address below, 0.6, is wrong)
    sender_email: float = Field(default=0.8, ge=0, le=1)
    # calibrated: precision 0.474 at every threshold below 0.95 (placeholder display names
    # get the rules' 0.9); no threshold meets 0.95, so it is left as it was
    contact_name: float = Field(default=0.5, ge=0, le=1)
    # calibrated: precision 0.105 at 0.5 (the domain guess), nothing kept above; raising it
    # would send every such message to review, so it is left as it was
    company: float = Field(default=0.5, ge=0, le=1)


class Sender(_Strict):
    """Who the tenant's follow-ups come from. Unset `from`: the global INBOXCRM_MAIL_FROM.
    `postal_address` is required as soon as the tenant has a follow-up rule: every
    commercial follow-up shows it (and the opt-out link)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_address: str | None = Field(default=None, alias="from", max_length=320)
    reply_to: str | None = Field(default=None, max_length=320)
    postal_address: str | None = Field(default=None, min_length=5, max_length=500)
    signature: str = Field(default="", max_length=2000)

    @field_validator("from_address", "reply_to")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _, address = email.utils.parseaddr(value)
        if "\n" in value or "\r" in value:
            raise ValueError("must be one line")
        try:
            _normalise(address)
        except InvalidAddress:
            raise ValueError("is not a valid address (e.g. \"Acme Sales <sales@acme.test>\")"
                             ) from None
        return value

    @property
    def display_name(self) -> str:
        return email.utils.parseaddr(self.from_address or "")[0]


SenderAuthentication = Literal["required", "prefer", "off"]
# The shared inbound credentials a tenant may accept (docs/architecture.md §7): the Standard
# Webhooks secret INBOXCRM_WEBHOOK_SECRET, the Postmark basic-auth pair, the Mailgun signing
# key; one per source of schemas.sources. A tenant's own INBOXCRM_WEBHOOK_SECRET_<TENANT>
# needs no entry: it names its tenant.
InboundCredential = SourceName
Mode = Literal["live", "shadow"]
_ENV_NAME = r"^[A-Z_][A-Z0-9_]{0,127}$"


class Ramp(_Strict):
    """A first live run (docs/architecture.md §6, "Going live"): for `days` after the tenant
    is switched to live, at most `max_auto_followups_per_hour` follow-ups per clock hour (UTC)
    go out without a person; the rest wait for a reviewer's approval (`ramp_limit`)."""

    days: float = Field(gt=0, le=90)
    max_auto_followups_per_hour: int = Field(ge=0, le=100_000)


class RetrySettings(_Strict):
    """The retries of one kind of destination call: the first wait, doubling (`backoff`) up to
    `maximum_seconds`, at most `max_attempts` attempts; then a person is asked. Held within
    the bounds of inboxcrm/schemas/models.py (RETRY_*), so no tenant can hammer a shared
    provider account or leave an item unseen for long."""

    max_attempts: int = Field(ge=1, le=RETRY_MAX_ATTEMPTS)
    initial_seconds: float = Field(ge=RETRY_INITIAL_SECONDS[0], le=RETRY_INITIAL_SECONDS[1])
    maximum_seconds: float = Field(gt=0, le=RETRY_MAXIMUM_SECONDS)
    backoff: float = Field(default=2.0, ge=RETRY_BACKOFF[0], le=RETRY_BACKOFF[1])

    @model_validator(mode="after")
    def _ordered(self) -> RetrySettings:
        if self.maximum_seconds < self.initial_seconds:
            raise ValueError(f"maximum_seconds ({self.maximum_seconds}) is below "
                             f"initial_seconds ({self.initial_seconds})")
        return self

    @classmethod
    def of(cls, settings: StepRetry) -> RetrySettings:
        return cls(max_attempts=settings.max_attempts, initial_seconds=settings.initial_seconds,
                   maximum_seconds=settings.maximum_seconds, backoff=settings.backoff)

    def step_retry(self) -> StepRetry:
        return StepRetry(max_attempts=self.max_attempts, initial_seconds=self.initial_seconds,
                         maximum_seconds=self.maximum_seconds, backoff=self.backoff)


class Retries(_Strict):
    """The tenant's retry settings (docs/architecture.md §4, "Retries"): CRM calls, the send,
    and the send of a rule of `urgency = "urgent"`. The plan carries them, so the workflow's
    retries and the ledger's budget agree, and an edit applies to items planned after it."""

    crm: RetrySettings = RetrySettings.of(DEFAULT_CRM_RETRY)
    send: RetrySettings = RetrySettings.of(DEFAULT_SEND_RETRY)
    urgent_send: RetrySettings = RetrySettings.of(DEFAULT_URGENT_SEND_RETRY)


class Retention(_Strict):
    """How long this tenant's data is kept, applied by the scheduled retention run
    (docs/architecture.md §7, "Retention"). Each period in days; None keeps that kind until
    an operator's `purge`/`forget`. `raw_days`: the stored message and the extraction's
    personal fields of settled items; `evidence_days`: the evidence recorded with operations
    and decisions; `audit_days`: the audit trail (the records of deletions themselves stay)."""

    raw_days: int | None = Field(default=None, ge=1, le=36_500)
    evidence_days: int | None = Field(default=None, ge=1, le=36_500)
    audit_days: int | None = Field(default=None, ge=1, le=36_500)

    @model_validator(mode="after")
    def _audit_outlives_content(self) -> Retention:
        for name in ("raw_days", "evidence_days"):
            kept = getattr(self, name)
            if self.audit_days is not None and (kept is None or kept > self.audit_days):
                raise ValueError(f"audit_days ({self.audit_days}) must be at least {name} "
                                 f"({kept}): the trail explains what the content was used for")
        return self


class Capacity(_Strict):
    """The tenant's share of a shared installation (docs/capacity.md, "Fair across tenants").
    `fairness_weight`: the tenant's weight in Temporal's task-queue fairness (its workflow
    and activity tasks are dispatched in proportion to it; 0.001 to 1000, as Temporal
    allows). `intake_per_second` / `intake_burst`: the relay's token bucket for the tenant's
    push deliveries, per relay process (over it: 429 with Retry-After); None: no limit."""

    fairness_weight: float = Field(default=1.0, ge=0.001, le=1000)
    intake_per_second: float | None = Field(default=None, gt=0, le=100_000)
    intake_burst: int = Field(default=100, ge=1, le=1_000_000)


class WebhookChannel(_Strict):
    """An incoming webhook (Slack message format). Its URL is a secret, so the policy names
    where to find it: an environment variable of the worker, or a file (a path relative to
    the repository root, or absolute) holding only the URL. Never the URL itself."""

    url_env: str | None = Field(default=None, pattern=_ENV_NAME)
    url_file: str | None = Field(default=None, min_length=1, max_length=1024)

    @model_validator(mode="before")
    @classmethod
    def _no_inline_secret(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("url" in data or "webhook_url" in data):
            raise ValueError("give the webhook URL by reference (url_env: an environment "
                             "variable, or url_file: a file), never in the policy file")
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> WebhookChannel:
        if (self.url_env is None) == (self.url_file is None):
            raise ValueError("a webhook needs exactly one of url_env or url_file")
        return self


# Where a relative `url_file` may point: the local stack's own folder (its stack tests'
# receiver writes the rehearsal tenant's URL there). Anything else is the tenant's secrets.
LOCAL_NOTIFY_DIR = ROOT / ".data" / "notify"


def check_webhook_reference(tenant: str, channel: WebhookChannel,
                            rules: DestinationRules) -> None:
    """The reviewers' webhook URL is a secret of the tenant's, read from the tenant's own
    namespace as its destinations' secrets are: `INBOXCRM_TENANT_<T>_*`, a file under
    `INBOXCRM_TENANT_SECRETS_DIR/<tenant>/`, or (a relative path) under `.data/notify/`.
    A policy could otherwise name any variable or file of the worker and have notices
    posted to whatever URL it holds (DestinationRefused, one line)."""
    where = "notifications.webhook"
    if channel.url_env is not None:
        check_secret(tenant, SecretRef(env=channel.url_env), rules, f"{where}.url_env")
        return
    assert channel.url_file is not None  # exactly one of them (WebhookChannel)
    path = Path(channel.url_file)
    if path.is_absolute():
        check_secret(tenant, SecretRef(file=str(path)), rules, f"{where}.url_file")
        return
    local = os.path.realpath(LOCAL_NOTIFY_DIR)
    resolved = os.path.realpath(ROOT / path)
    if not resolved.startswith(local + os.sep):
        raise DestinationRefused(
            f"{where}.url_file: file {channel.url_file} is outside the tenant's namespace "
            f"(a relative path must lie under .data/notify/; otherwise an absolute path under "
            f"INBOXCRM_TENANT_SECRETS_DIR/{tenant}/ or an INBOXCRM_TENANT_"
            f"{tenant_env_suffix(tenant)}_* variable)")


class Notifications(_Strict):
    """Where this tenant's reviewers hear about new and overdue review tasks, batched:
    references and reasons only, never a message's content or personal data."""

    webhook: WebhookChannel | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_inline_secret(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("webhook"), str):
            raise ValueError("webhook: give the URL by reference "
                             '({"url_env": "NAME"} or {"url_file": "path"}), never inline')
        return data
_AUTHSERV_ID = r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?$"


# A reason label as the classifier writes it (`http_401`, `http_401:INVALID_AUTHENTICATION`,
# `low_confidence:sender_email`), or a cause (OWNER_CAUSES): what `owners` maps to an owner.
_OWNER_KEY = re.compile(r"^[a-z][a-z0-9_]*(?::[A-Za-z0-9_.-]+)?$")
_ROLE = r"^[a-z][a-z0-9_-]{0,31}$"


class Authority(_Strict):
    """Who may do what needs more than a reviewer of the tenant (docs/architecture.md §6,
    "Authority"). `repeat_customer_facing`: the reviewer role (`inboxcrm reviewer add
    --role`) that alone may `retry` an ambiguous customer-facing send, a repeat that can
    reach the customer twice once the idempotency key's window has passed. None: any reviewer
    of the tenant (and the operator), as before."""

    repeat_customer_facing: str | None = Field(default=None, pattern=_ROLE)
    # The reviewer role that alone may approve a follow-up held for approval (as rendered or
    # edited, "Edited drafts"); None: any reviewer of the tenant.
    approve_followup: str | None = Field(default=None, pattern=_ROLE)


class TenantPolicy(_Strict):
    tenant: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$")
    mailboxes: list[str]
    domains: list[str]
    identity: IdentityPolicy = IdentityPolicy()
    updatable_fields: list[str] = ["name", "company"]
    review_on_conflict: list[str] = ["name"]
    followup_rules: list[FollowupRule] = []
    thresholds: Thresholds = Thresholds()
    review_owner: str = "sales-ops"
    # Owners per cause (docs/architecture.md §6, "Who is called"): a reason label or a cause
    # (`access`, `integration`, `data`, `rate`, `ambiguous`, `review`) → the owner its review
    # tasks go to; anything unmapped goes to `review_owner`.
    owners: dict[str, str] = {}
    authority: Authority = Authority()
    escalation_hours: float = Field(default=24, gt=0)
    # Who the sender is must be vouched for by the receiving MTA or provider before the
    # product writes to a CRM or mails anyone (docs/architecture.md §5).
    sender_authentication: SenderAuthentication = "required"
    trusted_authserv_ids: list[str] = []
    # An upstream filter's spam verdict (any dialect, inboxcrm/domain/extraction/spam.py):
    # a score at or above the threshold, or a flag; `ignore` drops the message, `review`
    # puts it in front of a person.
    spam_score_threshold: float = Field(default=5.0, gt=0)
    # Which shared credentials may write into this tenant. None by default: a credential
    # shared by several tenants reaches only those that list it.
    inbound_credentials: list[InboundCredential] = []
    # Going live (docs/architecture.md §6): the mode a tenant starts in until an operator
    # switches it (`inboxcrm mode`), the ramp that switch to live starts, and where
    # reviewers are told about their work.
    mode: Mode = "live"
    ramp: Ramp | None = None
    notifications: Notifications | None = None
    # The tenant's own words and destinations (docs/architecture.md §5).
    default_language: str = Field(default="en", pattern=r"^[a-z]{2,3}(?:-[a-z0-9]{1,8})?$")
    sender: Sender = Sender()
    destinations: TenantDestinations = TenantDestinations()
    _templates: dict[str, Template] = PrivateAttr(default_factory=dict)
    spam_action: Literal["ignore", "review"] = "ignore"
    # Its share of the installation: Temporal fairness weight and relay intake rate.
    capacity: Capacity = Capacity()
    retries: Retries = Retries()
    # How long its data is kept (the scheduled retention run): nothing by default.
    retention: Retention = Retention()
    # The scope of each kind of suppression (docs/consent.md), e.g.
    # {"list_unsubscribe": "marketing"}: unset reasons are `all`.
    suppression_scopes: dict[str, SuppressionScope] = {}
    # What the CRM's email activities carry of a message besides its subject
    # (docs/architecture.md §5, "The conversation in the CRM"): `snippet`, the first
    # CRM_SNIPPET_CHARS of its text without quoted history (the default); `minimised`,
    # that text up to CRM_TEXT_CHARS; `subject_only`, nothing more.
    crm_email_text: Literal["snippet", "minimised", "subject_only"] = "snippet"

    @field_validator("owners")
    @classmethod
    def _owners(cls, owners: dict[str, str]) -> dict[str, str]:
        for key, owner in owners.items():
            if not _OWNER_KEY.match(key):
                raise ValueError(f"owners: {key!r} is neither a cause ({', '.join(OWNER_CAUSES)})"
                                 " nor a reason label such as http_401 or match_review")
            if not owner.strip() or len(owner) > 64:
                raise ValueError(f"owners: the owner of {key!r} must be 1-64 characters")
        return owners

    @field_validator("suppression_scopes")
    @classmethod
    def _scopes(cls, scopes: dict[str, SuppressionScope]) -> dict[str, SuppressionScope]:
        unknown = sorted(set(scopes) - set(NARROWABLE_SUPPRESSIONS))
        if unknown:
            raise ValueError(f"suppression_scopes: {unknown} cannot be set; allowed: "
                             f"{list(NARROWABLE_SUPPRESSIONS)} (bounces and complaints stop "
                             "every send)")
        return scopes

    def owner_for(self, reason: str, cause: str) -> str:
        """The owner of a review task opened outside the workflow (a failed run): the exact
        reason's, else the cause's, else `review_owner` (the workflow's waits use
        `workflows.decisions.owner_of`, the same order)."""
        return self.owners.get(reason) or self.owners.get(cause) or self.review_owner

    def crm_text(self, text: str) -> str:
        """What of a message's own text (no quoted history) goes into the CRM's email
        activity under `crm_email_text`: a one-line snippet, the text, or nothing."""
        if self.crm_email_text == "subject_only":
            return ""
        if self.crm_email_text == "minimised":
            return text.strip()[:CRM_TEXT_CHARS]
        line = " ".join(text.split())
        return line if len(line) <= CRM_SNIPPET_CHARS else line[:CRM_SNIPPET_CHARS - 1] + "…"

    def suppression_scope(self, reason: str) -> SuppressionScope:
        """The scope a suppression recorded for `reason` gets under this policy."""
        return self.suppression_scopes.get(reason, "all")

    def send_retry(self, rule: FollowupRule) -> StepRetry:
        """The send's retry settings under the rule's urgency."""
        chosen = self.retries.urgent_send if rule.urgency == "urgent" else self.retries.send
        return chosen.step_retry()

    def marketing_rule_ids(self) -> list[str]:
        return [r.rule_id for r in self.followup_rules if r.purpose == "marketing"]

    @field_validator("trusted_authserv_ids")
    @classmethod
    def _authserv_ids(cls, ids: list[str]) -> list[str]:
        for authserv_id in ids:
            if not re.match(_AUTHSERV_ID, authserv_id):
                raise ValueError(f"authserv-id {authserv_id!r} is not a host name")
        return [i.lower() for i in ids]

    @field_validator("mailboxes")
    @classmethod
    def _mailboxes(cls, mailboxes: list[str]) -> list[str]:
        out = []
        for mailbox in mailboxes:
            try:
                out.append(_normalise(mailbox))
            except InvalidAddress as exc:
                raise ValueError("a mailbox is not a valid address") from exc
        return out

    @field_validator("domains")
    @classmethod
    def _domains(cls, domains: list[str]) -> list[str]:
        out = []
        for domain in domains:
            try:
                out.append(_normalise(f"postmaster@{domain}").rpartition("@")[2])
            except InvalidAddress as exc:
                raise ValueError(f"domain {domain!r} is not a valid domain") from exc
        return out

    @field_validator("updatable_fields", "review_on_conflict")
    @classmethod
    def _fields(cls, fields: list[str]) -> list[str]:
        unknown = sorted(set(fields) - set(KNOWN_FIELDS))
        if unknown:
            raise ValueError(f"unknown fields {unknown}; allowed: {list(KNOWN_FIELDS)}")
        return fields

    def is_own_mailbox(self, address: str) -> bool:
        try:
            return _normalise(address) in self.mailboxes
        except InvalidAddress:
            return False

    def is_own_domain(self, address_or_domain: str) -> bool:
        domain = address_or_domain.rpartition("@")[2]
        try:
            domain = _normalise(f"postmaster@{domain}").rpartition("@")[2]
        except InvalidAddress:
            return False
        return any(domain == own or domain.endswith("." + own) for own in self.domains)

    def rule_for_intent(self, intent: str) -> FollowupRule | None:
        for rule in self.followup_rules:
            if intent in rule.intents:
                return rule
        return None

    def rule_by_id(self, rule_id: str) -> FollowupRule | None:
        return next((r for r in self.followup_rules if r.rule_id == rule_id), None)

    @property
    def templates(self) -> dict[str, Template]:
        return dict(self._templates)

    def template_for(self, rule: FollowupRule) -> Template:
        """The rule's template (loading the policy checked that it exists)."""
        try:
            return self._templates[rule.template_id]
        except KeyError:
            raise PolicyError(f"tenant {self.tenant!r}: rule {rule.rule_id!r} has no template "
                              f"{rule.template_id!r}") from None

    def draft_limits(self, rule: FollowupRule) -> DraftLimits | None:
        """What a reviewer may edit in a follow-up of `rule`: its template's `draft.json`,
        narrowed by the rule's `draft`; either alone when only one declares; None (not
        editable) when neither does."""
        declared = self.template_for(rule).draft
        if declared is None:
            return rule.draft
        return DraftLimits.model_validate(dict(declared)).narrowed_by(rule.draft)

    def rule_version(self, rule: FollowupRule) -> int:
        """The version the intent key stores: the rule's number and its template's words."""
        return rule_version(rule.rule_id, rule.version, self.template_for(rule))


def policy_dir() -> Path:
    env = os.environ.get("INBOXCRM_POLICY_DIR")
    return Path(env) if env else ROOT / "policies"


_cache: dict[tuple[str, tuple[tuple[str, int, int], ...], DestinationRules],
             dict[str, TenantPolicy]] = {}


def _policy_files(directory: Path) -> list[Path]:
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        raise PolicyError(f"cannot read policy directory {directory}: {exc.strerror}") from exc
    return [p for p in entries if p.suffix in POLICY_SUFFIXES and p.is_file()]


def template_dir(policy_file: Path) -> Path:
    """The tenant's templates: `<policy dir>/<tenant>/templates/`."""
    return policy_file.parent / policy_file.stem / "templates"


def _template_files(policy_file: Path) -> list[Path]:
    folder = template_dir(policy_file)
    try:
        return sorted(p for p in folder.iterdir() if p.is_file())
    except OSError:
        return []


def _load_file(path: Path, rules: DestinationRules | None = None) -> TenantPolicy:
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"policy file {path}: cannot parse: {exc}") from exc
    if not isinstance(data, dict):
        raise PolicyError(f"policy file {path}: top level must be an object")
    try:
        policy = TenantPolicy.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise PolicyError(f"policy file {path}: invalid: {problems}") from exc
    if policy.tenant != path.stem:
        raise PolicyError(
            f"policy file {path}: tenant {policy.tenant!r} does not match the file name"
        )
    try:
        rules = rules or DestinationRules.from_environ()
        check_destinations(policy.tenant, policy.destinations, rules)
        if policy.notifications is not None and policy.notifications.webhook is not None:
            check_webhook_reference(policy.tenant, policy.notifications.webhook, rules)
    except DestinationRefused as exc:
        raise PolicyError(f"policy file {path}: {exc}") from None
    try:
        templates = load_templates(template_dir(path))
    except TemplateRefused as exc:
        raise PolicyError(f"policy file {path}: {exc}") from None
    for rule in policy.followup_rules:
        if rule.template_id not in templates:
            raise PolicyError(
                f"policy file {path}: rule {rule.rule_id!r} uses template "
                f"{rule.template_id!r}, which is not in {template_dir(path)} (expected "
                f"{rule.template_id}.{policy.default_language}.subject and .txt)")
        if policy.default_language not in templates[rule.template_id].languages:
            raise PolicyError(
                f"policy file {path}: template {rule.template_id!r} has no "
                f"{policy.default_language!r} version (the tenant's default_language)")
    for name, template in templates.items():
        if template.draft is None:
            continue
        try:
            DraftLimits.model_validate(dict(template.draft))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}"
                                 for e in exc.errors())
            raise PolicyError(f"policy file {path}: template {template_dir(path)}/{name}"
                              f".draft.json: {problems}") from None
    if policy.followup_rules and not policy.sender.postal_address:
        raise PolicyError(f"policy file {path}: sender.postal_address is required: every "
                          "follow-up must show the sender's postal address")
    policy._templates = templates
    return policy


def load_policies(directory: Path | None = None) -> dict[str, TenantPolicy]:
    """All tenant policies in `directory` (default `policy_dir()`), keyed by tenant.
    Raises PolicyError naming the file if any file is invalid."""
    directory = directory or policy_dir()
    files = _policy_files(directory)
    stamp: list[tuple[str, int, int]] = []
    for path in files:
        for part in (path, *_template_files(path)):
            st = part.stat()
            stamp.append((str(part.relative_to(directory)), st.st_mtime_ns, st.st_size))
    rules = DestinationRules.from_environ()
    key = (str(directory.resolve()), tuple(stamp), rules)
    cached = _cache.get(key)
    if cached is not None:
        return dict(cached)
    policies: dict[str, TenantPolicy] = {}
    namespaces: dict[str, str] = {}
    for path in files:
        policy = _load_file(path, rules)
        if policy.tenant in policies:
            raise PolicyError(f"policy file {path}: duplicate tenant {policy.tenant!r}")
        # Secrets, credentials and bindings are named by INBOXCRM_*_<TENANT>: two tenants
        # whose names differ only by `-`/`_` would share them.
        other = namespaces.setdefault(tenant_env_suffix(policy.tenant), policy.tenant)
        if other != policy.tenant:
            raise PolicyError(f"policy file {path}: tenant {policy.tenant!r} and tenant "
                              f"{other!r} share the namespace "
                              f"{tenant_env_suffix(policy.tenant)} (names differing only by "
                              "'-' and '_' are refused)")
        policies[policy.tenant] = policy
    _cache.clear()
    _cache[key] = policies
    return dict(policies)


# How often the default policy directory is walked for edits. Every step of an item asks
# for its tenant's policy; walking the folder (a stat per policy and template file) on each
# call was a measurable share of an item's CPU (`make bench`'s profile). An edit is seen
# within this long.
RECHECK_SECONDS = 1.0
# `crm_email_text`: how much of a message's own text a CRM email activity carries.
CRM_SNIPPET_CHARS = 200
CRM_TEXT_CHARS = 4000
_recent: tuple[str, float, dict[str, TenantPolicy]] | None = None


def current_policies() -> dict[str, TenantPolicy]:
    """The policies of `policy_dir()`, re-checked for edits at most every RECHECK_SECONDS
    (read-only: do not mutate the mapping)."""
    global _recent
    directory = str(policy_dir())
    now = time.monotonic()
    if _recent is not None and _recent[0] == directory and now - _recent[1] < RECHECK_SECONDS:
        return _recent[2]
    policies = load_policies(Path(directory))
    _recent = (directory, now, policies)
    return policies


def destinations_audit(policy: TenantPolicy) -> tuple[dict[str, Any], bool]:
    """What the audit records of a tenant's destinations: a fingerprint of the whole block,
    each part's provider, endpoint hosts and where its secrets are read from (names and
    paths, never values); and whether the tenant has none of its own."""
    import hashlib
    from urllib.parse import urlsplit

    from inboxcrm.schemas.destinations import secret_refs

    dumped = policy.destinations.model_dump(mode="json", exclude_none=True)
    detail: dict[str, Any] = {"fingerprint": hashlib.sha256(
        json.dumps(dumped, sort_keys=True).encode()).hexdigest()}
    for kind in ("crm", "mail"):
        block = getattr(policy.destinations, kind)
        if block is None:
            continue
        detail[kind] = {
            "provider": block.provider,
            "hosts": sorted({urlsplit(url).hostname or "" for _, url in block.endpoints()}),
            "secrets": sorted(f"{field}: {ref.describe()}" for field, ref in secret_refs(block)),
        }
    return detail, not dumped


def get_policy(tenant: str) -> TenantPolicy:
    policies = current_policies()
    try:
        return policies[tenant]
    except KeyError:
        raise UnknownTenant(tenant) from None


def tenants_accepting(credential: InboundCredential) -> frozenset[str]:
    """The tenants whose policy lists this shared credential, as `current_policies()` has
    them: an edit to `inbound_credentials` (a revocation too) holds within RECHECK_SECONDS.
    Walking the folder on every delivery was a sixth of the relay's CPU per item."""
    return frozenset(tenant for tenant, policy in current_policies().items()
                     if credential in policy.inbound_credentials)


def tenant_for_mailbox(mailbox: str) -> str | None:
    """The tenant whose policy lists `mailbox`, or None."""
    try:
        wanted = _normalise(mailbox)
    except InvalidAddress:
        return None
    for tenant, policy in load_policies().items():
        if wanted in policy.mailboxes:
            return tenant
    return None


def _normalise(address: str) -> str:
    """email-validator normalisation (IDNA domain in its Unicode form, NFC), then the whole
    address lower-cased. No DNS. `.test` domains are accepted (demo and tests)."""
    if not isinstance(address, str) or len(address) > 320:
        raise InvalidAddress("invalid email address")
    try:
        result = validate_email(
            address.strip(),
            check_deliverability=False,
            test_environment=True,
            allow_display_name=False,
            allow_quoted_local=False,
            allow_domain_literal=False,
        )
    except (EmailNotValidError, ValueError, UnicodeError):
        # idna / unicode edge cases inside the validator surface as ValueError too
        raise InvalidAddress("invalid email address") from None
    return str(result.normalized).lower()


def canonical_email(address: str, policy: TenantPolicy) -> str:
    """The tenant-scoped identity key of an address (docs/architecture.md §2).

    email-validator normalisation, the whole address lower-cased, IDN domains in their
    normalised (Unicode) form. Dot folding (`j.doe` = `jdoe`) and plus folding
    (`jdoe+tag` = `jdoe`) only when the policy opts in. Raises InvalidAddress (without the
    address in the message)."""
    normalised = _normalise(address)
    local, _, domain = normalised.rpartition("@")
    if policy.identity.fold_plus and "+" in local:
        local = local.split("+", 1)[0]
    if policy.identity.fold_dots:
        local = local.replace(".", "")
    if not local:
        raise InvalidAddress("invalid email address: empty local part after folding")
    return f"{local}@{domain}"


def tenant_priority(tenant: str) -> Priority:
    """The Temporal priority an item of the tenant's is started with: its fairness key is
    the tenant, its weight the policy's `capacity.fairness_weight` (1.0 when the policy
    cannot be read: the item is then refused by its own first step). Activities inherit it,
    so one tenant's backlog cannot hold another's tasks (docs/capacity.md)."""
    try:
        weight = get_policy(tenant).capacity.fairness_weight
    except (UnknownTenant, PolicyError):
        weight = 1.0
    return Priority(fairness_key=tenant, fairness_weight=weight)
