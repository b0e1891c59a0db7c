"""The extractor interface and its typed errors.

An extractor reads a MinimisedMessage and fills the extraction record; it never routes.
Errors carry no message content.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from inboxcrm.schemas.extraction import Extraction

from .minimise import MinimisedMessage


class ExtractorError(Exception):
    """Base class. `category` is one of "transient", "permanent", "invalid_output"."""

    category = "permanent"


class ExtractorUnavailable(ExtractorError):
    """Transient: the model server could not answer now (connection refused, timeout,
    429, 5xx) after the extractor's own bounded retries. The caller should retry later,
    after `retry_after` seconds if the server said so."""

    category = "transient"

    def __init__(self, message: str, *, retry_after: float | None = None,
                 status_code: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.status_code = status_code


class ExtractorMisconfigured(ExtractorError):
    """Permanent: credentials, model name, URL or request rejected (400/401/403/404/422).
    Retrying will not help until an operator fixes the configuration."""

    category = "permanent"

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ExtractionInvalid(ExtractorError):
    """The model kept answering with output that fails the schema (after bounded
    retries). Not retryable: the item is routed to review."""

    category = "invalid_output"

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


@runtime_checkable
class Extractor(Protocol):
    name: str  # "rules" | "llm"
    version: str  # e.g. "rules-2026.11.1" or "llm:<model>:prompt-v2"

    async def extract(self, message: MinimisedMessage) -> Extraction: ...
