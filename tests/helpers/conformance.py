"""The services' official SDKs as clients of a sandbox: how to build them, and the checks
that the conformance suite runs against the sandbox (and, to prove they bite, against a
deliberately wrong answer or a sandbox started with keys that never expire).

A check raises (AssertionError, the SDK's ValueError or its exception) when the sandbox
answers what the real service would not.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hubspot
import requests
import resend
from hubspot.crm.objects.notes import ApiClient as NotesApiClient
from simple_salesforce import Salesforce

HUBSPOT_NOTE_UPSERT_ANSWER = "BatchResponseSimplePublicUpsertObject"


def hubspot_client(url: str, token: str, ca: Path | None = None) -> hubspot.Client:
    """hubspot-api-client with client-side validation on: every answer must fit its model."""
    options: dict[str, Any] = {"host": url, "client_side_validation": True}
    if ca is not None:
        options["ssl_ca_cert"] = str(ca)
    return hubspot.Client.create(access_token=token, **options)


def hubspot_error(exc: Any) -> Any:
    """An SDK ApiException's body parsed by the SDK's own `Error` model (validation on)."""
    api = NotesApiClient(configuration=_validating_notes_configuration())
    return api.deserialize(_Body(exc.body), "Error")


def parse_note_upsert_answer(body: Mapping[str, Any]) -> Any:
    """A notes batch-upsert answer parsed by the SDK's model, as the SDK parses it."""
    api = NotesApiClient(configuration=_validating_notes_configuration())
    return api.deserialize(_Body(json.dumps(body).encode()), HUBSPOT_NOTE_UPSERT_ANSWER)


def _validating_notes_configuration() -> Any:
    from hubspot.crm.objects.notes import Configuration

    configuration = Configuration()
    configuration.client_side_validation = True
    return configuration


@dataclass(frozen=True)
class _Body:
    """What the SDK's deserializer reads from an HTTP response."""

    data: bytes

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return default


def use_resend(url: str, token: str | None) -> None:
    """The resend SDK is configured module-wide."""
    resend.api_url = url
    resend.api_key = token  # type: ignore[assignment]


def typed_dict_keys(kind: Any) -> frozenset[str]:
    """The keys an SDK TypedDict requires (its `http_headers` is NotRequired)."""
    return frozenset(kind.__required_keys__)


def assert_fits(kind: Any, value: Mapping[str, Any]) -> None:
    missing = typed_dict_keys(kind) - set(value)
    assert not missing, f"{kind.__name__} lacks {sorted(missing)}"


def check_idempotency_key_expires(sandbox_url: str, token: str, control: Any) -> None:
    """Inside 24 h the same key and payload answer the first email; past 24 h (moved on the
    sandbox clock through `control`, a sync callable(seconds)) the same request sends again,
    as Resend does."""
    use_resend(sandbox_url, token)
    key = f"conformance-{uuid.uuid4()}"
    params: resend.Emails.SendParams = {
        "from": "Sales <sales@acme.test>", "to": ["ada@example.com"], "subject": "Thanks",
        "text": "We got your message."}
    first = resend.Emails.send(params, {"idempotency_key": key})["id"]
    control(23 * 3600)
    assert resend.Emails.send(params, {"idempotency_key": key})["id"] == first
    control(2 * 3600)
    again = resend.Emails.send(params, {"idempotency_key": key})["id"]
    assert again != first, "an idempotency key older than 24 h still deduplicated"


def salesforce_client(url: str, token: str, ca: Path, version: str = "62.0") -> Salesforce:
    """simple-salesforce speaks only https: the sandbox's self-signed CA is trusted."""
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE would otherwise override `verify`
    session.verify = str(ca)
    return Salesforce(instance_url=url, session_id=token, version=version, session=session)
