"""Extraction, validation and routing of one inbound email (docs/architecture.md §5, issue #4).

    outcome = await extract_and_route(raw_bytes, get_policy("acme"), extractor)

An email is untrusted input. `minimise` decides what any extractor may see; the extractor
(LLM or rules) only fills the small record of `schemas/extraction.schema.json`; validation
and routing are deterministic code in `route.py`; identity follows the tenant policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from inboxcrm.domain.policy import PolicyError, TenantPolicy, UnknownTenant, get_policy
from schemas.extraction import Extraction
from schemas.models import Route

from .authentication import Authentication, authenticate, blocking_reason
from .base import (
    ExtractionInvalid,
    Extractor,
    ExtractorError,
    ExtractorMisconfigured,
    ExtractorUnavailable,
)
from .minimise import MinimisedMessage, minimise
from .route import Decision, ignore_reasons, validate_and_route
from .rules import RULES_VERSION, RulesExtractor

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


async def extract_and_route(
    raw: bytes, policy: TenantPolicy, extractor: Extractor | None = None,
    source: str = "standard",
) -> ExtractionOutcome:
    """Minimise, extract, validate and route one raw message that arrived through `source`
    (standard | postmark | mailgun | smtp: which provider verdicts are trustworthy).

    Never raises on bad input. Raises ExtractorUnavailable (transient: retry later, see
    `retry_after`) or ExtractorMisconfigured (permanent) from an LLM extractor; an LLM
    that keeps producing invalid output yields a `review` outcome instead.
    Header-only ignore decisions (auto-replies, bounces, lists, loops) never call the
    model: the offline rules extractor fills the record for those."""
    message = minimise(raw)
    auth = authenticate(message, policy, source)
    chosen: Extractor = extractor or _RULES
    ignore = ignore_reasons(message, policy, source)
    if ignore:
        chosen = _RULES
    extra_reasons: list[str] = []
    try:
        extraction = await chosen.extract(message)
    except ExtractionInvalid:
        extraction = Extraction.empty()
        extra_reasons.append("schema_invalid")
    except ExtractorError:
        raise  # transient or permanent: the caller's retry policy decides
    except Exception:  # a defect must not turn untrusted input into a crash: a person looks
        extraction = Extraction.empty()
        extra_reasons.append("extractor_failed")
    try:
        decision = validate_and_route(message, extraction, policy, precomputed_ignore=ignore,
                                      source=source, auth_reason=blocking_reason(auth, policy))
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
        extractor=chosen.name,
        extractor_version=chosen.version,
        authentication=auth.as_json(),
        suppression_candidates=_suppression_candidates(message, route),
    )


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
