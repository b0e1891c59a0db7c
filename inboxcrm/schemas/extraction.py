"""Pydantic mirror of `inboxcrm/schemas/extraction.schema.json` (the extraction record of
docs/architecture.md §5). A test proves the two agree; change both together."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

# Fields of the record an extractor may leave out (every other one is required).
OPTIONAL_FIELDS = frozenset({"sensitive_attribute"})
SCHEMA_PATH = Path(__file__).resolve().parent / "extraction.schema.json"

Intent = Literal[
    "product_question",
    "pricing_request",
    "demo_request",
    "support_request",
    "complaint",
    "opt_out",
    "partnership",
    "other",
]
INTENTS: tuple[str, ...] = get_args(Intent)

VALUE_MAX_CHARS = 320
EVIDENCE_MAX_CHARS = 500


class ExtractedField(BaseModel):
    """One extracted value with the extractor's confidence and a verbatim quote."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    value: str | None = Field(max_length=VALUE_MAX_CHARS)
    confidence: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    evidence: str | None = Field(max_length=EVIDENCE_MAX_CHARS)

    @classmethod
    def empty(cls) -> ExtractedField:
        return cls(value=None, confidence=0.0, evidence=None)


class Extraction(BaseModel):
    """The record an extractor returns. It describes the message; it never chooses an
    action."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    sender_email: ExtractedField
    contact_name: ExtractedField
    company: ExtractedField
    intent: Intent
    possible_opt_out: bool
    needs_human_review: bool
    # A special category of personal data in the message (docs/architecture.md §5): the
    # item goes to review (`sensitive_attribute`). Optional in the record (absent: false),
    # so records stored before it still read.
    sensitive_attribute: bool = False

    @classmethod
    def empty(cls, *, needs_human_review: bool = True) -> Extraction:
        """The record used when nothing trustworthy could be extracted."""
        return cls(
            sender_email=ExtractedField.empty(),
            contact_name=ExtractedField.empty(),
            company=ExtractedField.empty(),
            intent="other",
            possible_opt_out=False,
            needs_human_review=needs_human_review,
        )


@lru_cache(maxsize=1)
def _schema_text() -> str:
    return SCHEMA_PATH.read_text(encoding="utf-8")


def load_schema() -> dict[str, Any]:
    """A fresh copy of the JSON Schema (callers may modify it)."""
    schema: dict[str, Any] = json.loads(_schema_text())
    return schema
