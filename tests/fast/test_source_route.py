"""The one route every push source shares (`inboxcrm.ingress.sources.base.receive`), called
directly with a ledger stand-in (PostgreSQL cannot exist in the fast tier): what reaches the
ledger, what is refused before it, what is counted; and the ingest path a mailbox watcher
calls, the same `Intake.ingest`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from inboxcrm.ingress.intake import Delivery, IngestResult, Intake
from inboxcrm.ingress.metrics import RelayMetrics
from inboxcrm.ingress.sources import push_sources, source_class
from inboxcrm.ingress.sources.base import receive
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.sources import SOURCE_NAMES

ROOT = Path(__file__).resolve().parents[2]
SHARED = "whsec_" + base64.b64encode(b"s" * 32).decode()
RAW = "From: Jane <jane@example.com>\r\nTo: sales@acme.test\r\nSubject: hi\r\n\r\nhello\r\n"


@pytest.fixture(autouse=True)
def demo_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INBOXCRM_POLICY_DIR", str(ROOT / "policies"))


class Ledger:
    """The ledger's contract as `Intake` sees it: what was handed in, and an outage."""

    pool: Any = None

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.stored: list[Delivery] = []

    async def ingest(self, delivery: Delivery) -> IngestResult:
        if self.down:
            raise OSError("connection refused")
        status = "duplicate" if any(d.workflow_id == delivery.workflow_id
                                    for d in self.stored) else "accepted"
        if status == "accepted":
            self.stored.append(delivery)
        return IngestResult(status, delivery.workflow_id, "received")


class Body:
    """A request body as chunks; counts what the route read of it."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.read = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        for at in range(0, len(self.body), 1024):
            chunk = self.body[at:at + 1024]
            self.read += len(chunk)
            yield chunk


def standard(tenant: str = "acme", mailbox: str = "sales@acme.test",
             delivery_id: str = "E-1", secret: str = SHARED) -> tuple[dict[str, str], bytes]:
    body = json.dumps({"tenant": tenant, "mailbox": mailbox, "delivery_id": delivery_id,
                       "raw": RAW}).encode()
    now = str(int(time.time()))
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"msg_1.{now}.".encode() + body, hashlib.sha256).digest()
    return {"content-type": "application/json", "webhook-id": "msg_1",
            "webhook-timestamp": now,
            "webhook-signature": "v1," + base64.b64encode(mac).decode()}, body


def counted(metrics: RelayMetrics, source: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value("inboxcrm_deliveries_received_total",
                                              {"source": source, "outcome": outcome})
    return value or 0.0


def auth_failures(metrics: RelayMetrics, source: str) -> float:
    value = metrics.registry.get_sample_value("inboxcrm_signature_failures_total",
                                              {"source": source})
    return value or 0.0


def source(name: str, **values: Any) -> Any:
    return source_class(name)(Settings(env="local", **values))


async def test_a_signed_delivery_reaches_the_ledger_once_and_a_redelivery_is_a_duplicate(
) -> None:
    ledger, metrics = Ledger(), RelayMetrics()
    intake = Intake(ledger, metrics)
    headers, body = standard()
    first = await receive(source("standard", webhook_secret=SHARED), headers,
                          Body(body).chunks(), intake)
    again = await receive(source("standard", webhook_secret=SHARED), headers,
                          Body(body).chunks(), intake)
    assert first.status_code == again.status_code == 200
    answers = [json.loads(bytes(r.body)) for r in (first, again)]
    assert [a["status"] for a in answers] == ["accepted", "duplicate"]
    assert answers[0]["workflow_id"] == "inbound/acme/standard/sales@acme.test/E-1"
    [stored] = ledger.stored
    assert (stored.tenant, stored.source, stored.mailbox, stored.delivery_id) == (
        "acme", "standard", "sales@acme.test", "E-1")
    assert stored.raw == RAW.encode()
    assert counted(metrics, "standard", "accepted") == 1
    assert counted(metrics, "standard", "duplicate") == 1


async def test_a_tenant_outside_the_credentials_binding_is_a_403_and_nothing_stored(
) -> None:
    ledger, metrics = Ledger(), RelayMetrics()
    headers, body = standard(tenant="globex", mailbox="hello@globex.test")
    answer = await receive(source("standard", webhook_secret=SHARED), headers,
                           Body(body).chunks(), Intake(ledger, metrics))
    assert answer.status_code == 403 and ledger.stored == []
    assert counted(metrics, "standard", "forbidden") == 1


async def test_a_source_without_its_credential_is_a_401_with_the_body_unread() -> None:
    metrics = RelayMetrics()
    for name in SOURCE_NAMES:
        headers, payload = standard()
        body = Body(payload)
        answer = await receive(source(name), headers, body.chunks(),
                               Intake(Ledger(), metrics))
        assert (answer.status_code, body.read) == (401, 0), name
        assert auth_failures(metrics, name) == 1
    postmark = await receive(source("postmark"), {}, Body(b"{}").chunks(),
                             Intake(Ledger(), metrics))
    assert postmark.headers["www-authenticate"] == 'Basic realm="inboxcrm postmark"'


async def test_a_wrong_signature_is_a_401_after_reading_and_nothing_stored() -> None:
    ledger, metrics = Ledger(), RelayMetrics()
    other = "whsec_" + base64.b64encode(b"o" * 32).decode()
    headers, body = standard(secret=other)
    answer = await receive(source("standard", webhook_secret=SHARED), headers,
                           Body(body).chunks(), Intake(ledger, metrics))
    assert answer.status_code == 401 and ledger.stored == []
    assert auth_failures(metrics, "standard") == 1


async def test_a_body_over_the_cap_is_a_413_read_no_further_than_the_cap() -> None:
    headers, body = standard()
    sent = Body(body + b" " * 50_000)
    answer = await receive(source("standard", webhook_secret=SHARED, max_body_bytes=4096),
                           headers, sent.chunks(), Intake(Ledger(), RelayMetrics()))
    assert answer.status_code == 413 and sent.read <= 4096 + 1024


async def test_a_ledger_outage_is_a_503_counted_by_source() -> None:
    metrics = RelayMetrics()
    headers, body = standard()
    answer = await receive(source("standard", webhook_secret=SHARED), headers,
                           Body(body).chunks(), Intake(Ledger(down=True), metrics))
    assert answer.status_code == 503
    assert json.loads(bytes(answer.body))["message"] == "ledger unavailable; retry later"
    assert counted(metrics, "standard", "ledger_unavailable") == 1


async def test_a_mailbox_watchers_delivery_takes_the_push_routes_ingest_path() -> None:
    """What a pull source hands over is a `Delivery`; `Intake.ingest` stores it like a push
    delivery, and says whether the watcher may move its cursor past it."""
    ledger, metrics = Ledger(), RelayMetrics()
    arrived = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    delivery = Delivery("acme", "imap", "sales@acme.test", "1700000000.42", RAW.encode(),
                        arrived)
    result = await Intake(ledger, metrics).ingest(delivery)
    assert result.stored and result.status == "accepted"
    assert result.workflow_id == "inbound/acme/imap/sales@acme.test/1700000000.42"
    assert ledger.stored == [delivery] and ledger.stored[0].received_at == arrived
    assert (await Intake(ledger, metrics).ingest(delivery)).status == "duplicate"
    down = await Intake(Ledger(down=True), metrics).ingest(delivery)
    assert not down.stored  # offered again on the next pass
    assert counted(metrics, "imap", "accepted") == counted(metrics, "imap", "duplicate") == 1


def test_every_registered_source_is_served_at_its_paths() -> None:
    sources = push_sources(Settings(env="local", mailgun_signing_key=SecretStr("k" * 40)))
    assert [s.name for s in sources] == list(SOURCE_NAMES)
    paths = {path for s in sources for path in s.paths}
    assert {"/v1/inbound/standard", "/v1/inbound/postmark", "/v1/inbound/mailgun",
            "/v1/inbound/mailgun/mime"} <= paths
