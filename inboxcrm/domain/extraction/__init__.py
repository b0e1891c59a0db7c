"""Extraction, validation and routing of one inbound email (docs/architecture.md §5, issue #4).

    outcome = await extract_and_route(raw_bytes, get_policy("acme"), extractor)

An email is untrusted input. `minimise` decides what any extractor may see; the extractor
(LLM or rules) only fills the small record of `inboxcrm/schemas/extraction.schema.json`; validation
and routing are deterministic code in `route.py`; identity follows the tenant policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from inboxcrm.domain.policy import PolicyError, TenantPolicy, UnknownTenant, get_policy
from inboxcrm.domain.templates import languages_named
from inboxcrm.platform.config import Settings
from inboxcrm.platform.workpool import IN_PROCESS, BudgetExceeded, Runner, WorkFailed, WorkPool
from inboxcrm.schemas.extraction import Extraction
from inboxcrm.schemas.models import Route

from .authentication import Authentication, authenticate, blocking_reason
from .base import (
    ExtractionInvalid,
    Extractor,
    ExtractorError,
    ExtractorMisconfigured,
    ExtractorUnavailable,
)
from .limits import MAX_RAW_BYTES
from .minimise import MinimisedMessage, date_written, minimise, thread_refs
from .route import TOO_COMPLEX, Decision, ignore_reasons, validate_and_route
from .rules import RULES_VERSION, RulesExtractor, extract_rules

__all__ = [
    "Authentication",
    "ExtractionInvalid",
    "ExtractionOutcome",
    "Extractor",
    "ExtractorError",
    "ExtractorMisconfigured",
    "ExtractorUnavailable",
    "MinimisedMessage",
    "OfflineExtractError",
    "OfflineExtraction",
    "RULES_VERSION",
    "RulesExtractor",
    "build_extractor",
    "extract_and_route",
    "extract_offline",
    "minimise",
    "summary",
    "view_message",
    "warm_up",
    "work_pool",
]


class ExtractionOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    extraction: Extraction
    route: Route
    reasons: list[str]
    canonical_email: str | None
    extractor: str
    extractor_version: str
    authentication: dict[str, Any] = {}  # Authentication.as_json() of the sender's verdict
    # a hard bounce or complaint about earlier mail: {"reason": "bounced"|"complaint",
    # "recipients": [...]}; the caller suppresses them if that mail was ours
    suppression_candidates: dict[str, Any] | None = None
    # minimise.REPLY_HEADERS, read once here: when the message was written (its Date, for
    # the CRM note) and the languages it names (for the follow-up)
    written_at: datetime | None = None
    languages: list[str] = []
    # the message-IDs it answers (References, In-Reply-To): the thread it belongs to
    thread_refs: list[str] = []

    def section10_json(self) -> dict[str, Any]:
        """The `inboxcrm extract --json` document of docs/architecture.md §10 (its four
        keys), plus the sender's `authentication` verdict."""
        return {
            "extraction": self.extraction.model_dump(mode="json"),
            "route": self.route,
            "reasons": list(self.reasons),
            "canonical_email": self.canonical_email,
            "authentication": dict(self.authentication),
        }


_RULES = RulesExtractor()


@dataclass(frozen=True)
class Prepared:
    """What the extractor and the router need of a message, from `prepare` (the work on the
    raw bytes; everything here is bounded)."""

    message: MinimisedMessage
    auth: Authentication
    ignore: list[str]


def prepare(raw: bytes, raw_size: int, policy: TenantPolicy, source: str) -> Prepared:
    """Minimise the message and take the header-only decisions: the part of extraction
    whose cost grows with the raw message, run under the work budget (a `Runner`)."""
    message = minimise(raw, raw_size=raw_size)
    return Prepared(message, authenticate(message, policy, source),
                    ignore_reasons(message, policy, source))


def finish(prepared: Prepared, extraction: Extraction, extra_reasons: list[str],
           extractor: tuple[str, str], policy: TenantPolicy, source: str) -> ExtractionOutcome:
    """Validate and route an extractor's record (deterministic; over bounded text)."""
    message, auth = prepared.message, prepared.auth
    try:
        decision = validate_and_route(message, extraction, policy,
                                      precomputed_ignore=prepared.ignore, source=source,
                                      auth_reason=blocking_reason(auth, policy))
    except Exception:
        decision = Decision("review", ["routing_failed"], None, Extraction.empty())
    route: Route = decision.route
    reasons = list(decision.reasons)
    canonical = decision.canonical_email
    if extra_reasons:
        route, canonical = ("review", None) if route != "ignore" else (route, None)
        reasons = extra_reasons + [r for r in reasons if r not in extra_reasons]
    record = decision.extraction
    if route == "review" and not record.needs_human_review:
        record = record.model_copy(update={"needs_human_review": True})
    return ExtractionOutcome(
        extraction=record,
        route=route,
        reasons=reasons,
        canonical_email=canonical,
        extractor=extractor[0],
        extractor_version=extractor[1],
        authentication=auth.as_json(),
        suppression_candidates=_suppression_candidates(message, route),
        written_at=date_written(message.routing_headers.get("Date")),
        languages=languages_named(message.routing_headers.get("Content-Language"),
                                  message.routing_headers.get("Accept-Language")),
        thread_refs=thread_refs(message.routing_headers.get("References"),
                                message.routing_headers.get("In-Reply-To")),
    )


def extract_with_rules(raw: bytes, raw_size: int, policy: TenantPolicy,
                       source: str) -> ExtractionOutcome:
    """The whole pipeline with the offline rules extractor, in one call (one trip to a work
    pool child per message)."""
    prepared = prepare(raw, raw_size, policy, source)
    extra_reasons: list[str] = []
    try:
        extraction = extract_rules(prepared.message)
    except Exception:  # a defect must not turn untrusted input into a crash: a person looks
        extraction = Extraction.empty()
        extra_reasons.append("extractor_failed")
    return finish(prepared, extraction, extra_reasons, (_RULES.name, _RULES.version), policy,
                  source)


def too_complex(extractor: Extractor, reason: str = TOO_COMPLEX) -> ExtractionOutcome:
    """The outcome of a message whose extraction exceeded its work budget: a person looks
    (nothing was read, so no sender is proposed)."""
    return ExtractionOutcome(
        extraction=Extraction.empty().model_copy(update={"needs_human_review": True}),
        route="review", reasons=[reason], canonical_email=None,
        extractor=extractor.name, extractor_version=extractor.version,
        authentication=Authentication("none").as_json())


async def extract_and_route(
    raw: bytes, policy: TenantPolicy, extractor: Extractor | None = None,
    source: str = "standard", runner: Runner = IN_PROCESS,
) -> ExtractionOutcome:
    """Minimise, extract, validate and route one raw message that arrived through `source`
    (standard | postmark | mailgun | smtp: which provider verdicts are trustworthy).

    The work on the message runs through `runner`: in a worker and the relay a `WorkPool`
    (off the event loop, killed at its time limit, in the policy's tenant's queue), in the
    CLI and tests in this process. A message over its work budget is a `review` outcome
    with reason `too_complex`.

    Never raises on bad input. Raises ExtractorUnavailable (transient: retry later, see
    `retry_after`) or ExtractorMisconfigured (permanent) from an LLM extractor, and
    WorkPoolUnavailable when the runner cannot run anything (not the message's fault);
    an LLM that keeps producing invalid output yields a `review` outcome instead.
    Header-only ignore decisions (auto-replies, bounces, lists, loops) never call the
    model: the offline rules extractor fills the record for those."""
    chosen: Extractor = extractor or _RULES
    head = raw[:MAX_RAW_BYTES]
    runner = runner.for_tenant(policy.tenant)  # waits in this tenant's queue only
    try:
        if isinstance(chosen, RulesExtractor):
            return await runner.run(extract_with_rules, head, len(raw), policy, source)
        prepared = await runner.run(prepare, head, len(raw), policy, source)
    except BudgetExceeded:
        return too_complex(chosen)
    except WorkFailed:  # a defect, not the message's size: a person looks
        return too_complex(chosen, "extractor_failed")
    if prepared.ignore:
        chosen = _RULES
    extra_reasons: list[str] = []
    try:
        extraction = await chosen.extract(prepared.message)
    except ExtractionInvalid:
        extraction = Extraction.empty()
        extra_reasons.append("schema_invalid")
    except ExtractorError:
        raise  # transient or permanent: the caller's retry policy decides
    except Exception:  # a defect must not turn untrusted input into a crash: a person looks
        extraction = Extraction.empty()
        extra_reasons.append("extractor_failed")
    try:
        return await runner.run(finish, prepared, extraction, extra_reasons,
                                (chosen.name, chosen.version), policy, source)
    except BudgetExceeded:
        return too_complex(chosen)
    except WorkFailed:
        return too_complex(chosen, "extractor_failed")


def view_message(raw: bytes, policy: TenantPolicy | None,
                 source: str) -> tuple[MinimisedMessage, Authentication | None]:
    """What the review card shows of a stored message: the minimised message and, under the
    tenant's policy, the sender's verdict (run under the work budget, like extraction)."""
    message = minimise(raw[:MAX_RAW_BYTES], raw_size=len(raw))
    return message, authenticate(message, policy, source) if policy is not None else None


# What a work pool child imports before its first call (everything the calls above use).
PRELOAD = ("inboxcrm.domain.extraction",)


def work_pool(settings: Settings, processes: int) -> WorkPool:
    """The pool that runs the work on messages (extraction in a worker, the review card in
    the relay) under the settings' budget (`INBOXCRM_WORK_*`). `await pool.start()` it."""
    return WorkPool(processes=processes, time_limit=settings.work_time_limit_seconds,
                    memory_limit_mb=settings.work_memory_limit_mb or None,
                    preload=PRELOAD, warmup=warm_up)


def warm_up() -> None:
    """Run the pipeline once on a small message: a work pool child does this at start, so
    its first real message pays no lazy set-up (the JSON Schema validator, regex caches)."""
    policy = TenantPolicy(tenant="warm-up", mailboxes=["sales@example.com"],
                          domains=["example.com"])
    raw = (b"From: Jane Doe <jane@example.org>\r\nTo: sales@example.com\r\n"
           b"Subject: Pricing?\r\n\r\nHello, what does it cost?\r\n\r\nBest regards\r\n"
           b"Jane Doe\r\n")
    extract_with_rules(raw, len(raw), policy, "standard")


def _suppression_candidates(message: MinimisedMessage, route: str) -> dict[str, Any] | None:
    report = message.report
    if route != "ignore" or report is None or report.suppresses is None:
        return None
    return {"reason": report.suppresses, "recipients": list(report.recipients)}


def build_extractor(settings: object) -> Extractor:
    """The extractor the settings ask for. `settings.extractor` is "rules" or "llm"; when it
    is absent, "llm" is chosen only if `llm_base_url` is set (no model configured means
    rules). Reads attributes with getattr so any object (e.g. SimpleNamespace) works."""
    kind = getattr(settings, "extractor", None)
    base_url = getattr(settings, "llm_base_url", None)
    if kind is None:
        kind = "llm" if base_url else "rules"
    kind = str(kind).strip().lower()
    if kind == "rules":
        return RulesExtractor()
    if kind != "llm":
        raise ValueError(f"unknown extractor {kind!r}; expected 'rules' or 'llm'")
    model = getattr(settings, "llm_model", None)
    if not model:
        raise ValueError("extractor 'llm' needs llm_model")
    from .llm import LLMExtractor

    return LLMExtractor(
        base_url=base_url or None,
        api_key=getattr(settings, "llm_api_key", None),
        model=str(model),
        timeout_seconds=float(getattr(settings, "llm_timeout_seconds", 30.0) or 30.0),
        max_schema_retries=int(getattr(settings, "llm_max_schema_retries", 2)),
        max_transient_retries=int(getattr(settings, "llm_max_transient_retries", 2)),
    )


def _settings() -> object:
    try:
        from inboxcrm.platform.config import get_settings

        return get_settings()
    except Exception:  # no settings module or unreadable environment: stay offline
        return object()


def summary(outcome: ExtractionOutcome) -> str:
    """The human-readable summary `inboxcrm extract` prints without --json."""
    record = outcome.extraction
    lines = [
        f"route:           {outcome.route}",
        f"reasons:         {', '.join(outcome.reasons) or '-'}",
        f"canonical_email: {outcome.canonical_email or '-'}",
        f"intent:          {record.intent}",
        f"possible_opt_out:{' yes' if record.possible_opt_out else ' no'}",
        f"authentication:  {outcome.authentication.get('verdict', '-')}"
        + (f" ({outcome.authentication['reason']})"
           if outcome.authentication.get("reason") else ""),
    ]
    for name in ("sender_email", "contact_name", "company"):
        field = getattr(record, name)
        value = field.value if field.value is not None else "-"
        lines.append(f"{name + ':':<17}{value} (confidence {field.confidence:.2f})")
    lines.append(f"extractor:       {outcome.extractor_version}")
    return "\n".join(lines)


class OfflineExtractError(Exception):
    """`inboxcrm extract` cannot run: the file cannot be read, the tenant is unknown, or the
    extractor is misconfigured. The message says which."""


@dataclass(frozen=True)
class OfflineExtraction:
    outcome: ExtractionOutcome
    warnings: list[str]     # e.g. the model could not answer and the rules were used


def extract_offline(
    path: Path, tenant: str, extractor: Extractor | None = None, source: str = "standard",
) -> OfflineExtraction:
    """`inboxcrm extract FILE.eml [--tenant T]`: offline extraction and validation under the
    tenant's policy. Writes nothing; answers for any content (garbage included). Raises
    OfflineExtractError if the file cannot be read or the tenant is unknown."""
    import asyncio

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise OfflineExtractError(f"cannot read {path}: {exc.strerror}") from None
    try:
        policy = get_policy(tenant)
    except UnknownTenant:
        raise OfflineExtractError(f"unknown tenant {tenant!r}") from None
    except PolicyError as exc:
        raise OfflineExtractError(str(exc)) from None
    if extractor is None:
        try:
            extractor = build_extractor(_settings())
        except ValueError as exc:
            raise OfflineExtractError(str(exc)) from None
    warnings: list[str] = []
    try:
        outcome = asyncio.run(extract_and_route(raw, policy, extractor, source))
    except ExtractorError as exc:
        # the model could not answer: say so, still answer with the offline rules
        warnings.append(f"{exc}; falling back to rules")
        outcome = asyncio.run(extract_and_route(raw, policy, _RULES, source))
    return OfflineExtraction(outcome, warnings)
