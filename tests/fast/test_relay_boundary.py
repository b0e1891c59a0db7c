"""The relay's side of the boundary, without a stack: settings that refuse open defaults,
credentials bound to tenants, the streaming form reader's limits on crafted bodies, and the
routes called at the ASGI level, where the bytes the app pulls from the request are counted
(so "refused without reading the body" is measured, not assumed)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import shutil
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from inboxcrm.domain import policy as policy_module
from inboxcrm.domain.policy import PolicyError, load_policies, tenants_accepting
from inboxcrm.ingress.app import create_app
from inboxcrm.ingress.deps import get_ingestor
from inboxcrm.ingress.form import (
    FormLimits,
    FormTooLarge,
    MultipartReader,
    form_reader,
    parse_form_bytes,
    read_form,
)
from inboxcrm.ingress.intake import BadRequest
from inboxcrm.ingress.metrics import RelayMetrics
from inboxcrm.ingress.review import MAX_LOGIN_BYTES
from inboxcrm.ingress.sources.standard import (
    configured_keys,
    matching_keys,
    signature_headers,
)
from inboxcrm.ingress.tenancy import Binding, Forbidden, check_tenant, resolve_recipient
from inboxcrm.platform.config import InsecureSetting, Settings
from inboxcrm.stack.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
SHARED = "whsec_" + base64.b64encode(b"s" * 32).decode()
GLOBEX = "whsec_" + base64.b64encode(b"g" * 32).decode()
LONG = "x" * 40


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the process environment: start every test from none of ours, with
    the repository's demo policies."""
    import os

    for name in list(os.environ):
        if name.startswith("INBOXCRM_") or name in ("DATABASE_URL", "TEMPORAL_ADDRESS"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INBOXCRM_POLICY_DIR", str(ROOT / "policies"))
    monkeypatch.setenv("INBOXCRM_MAIL_FROM", "Sales <sales@example.com>")  # required outside local


# ------------------------------------------------------------------ no open defaults


def test_no_webhook_secret_is_built_in() -> None:
    settings = Settings()
    assert settings.webhook_secret == "" and settings.webhook_tenant_secrets == {}
    assert configured_keys(settings) == []
    # The secret that used to be the default is nowhere in the code or the deploy files.
    old = "ZGV2LW9ubHktc2VjcmV0LWNoYW5nZS1tZS0xMjM0NTY3OA"
    for folder in ("inboxcrm", "deploy", "bench"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yml", ".yaml", ".md", ".example"):
                assert old not in path.read_text(errors="replace"), path


@pytest.mark.parametrize("field", ["webhook_secret", "postmark_password",
                                   "mailgun_signing_key", "unsubscribe_secret",
                                   "review_token", "codec_token"])
def test_short_credentials_refuse_to_start_outside_the_local_stack(field: str) -> None:
    short = "whsec_dGlueQ==" if field == "webhook_secret" else "tiny-value"
    with pytest.raises(InsecureSetting, match="shorter than 32 bytes") as refused:
        Settings(**{field: short})
    assert short.removeprefix("whsec_") not in str(refused.value)  # the value never shows
    assert Settings(**{field: short, "env": "local"}).env == "local"
    assert Settings(**{field: SHARED if field == "webhook_secret" else LONG})


def test_short_tenant_secret_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INBOXCRM_WEBHOOK_SECRET_GLOBEX", "whsec_c2hvcnQ=")
    with pytest.raises(InsecureSetting, match="INBOXCRM_WEBHOOK_SECRET_GLOBEX"):
        Settings()
    monkeypatch.setenv("INBOXCRM_ENV", "local")
    assert Settings().webhook_tenant_secrets == {"globex": "whsec_c2hvcnQ="}


def test_tenant_secrets_come_from_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INBOXCRM_WEBHOOK_SECRET", SHARED)
    monkeypatch.setenv("INBOXCRM_WEBHOOK_SECRET_GLOBEX", GLOBEX)
    keys = configured_keys(Settings())
    assert [(k.tenant, k.key) for k in keys] == [(None, b"s" * 32), ("globex", b"g" * 32)]
    assert keys[0].binding().tenants == {"acme", "rehearsal", "initech"}  # policies list "standard"
    assert keys[1].binding().tenants == {"globex"}
    monkeypatch.setenv("INBOXCRM_WEBHOOK_SECRET_GLOBEX", "whsec_not base64!")
    with pytest.raises(ValueError, match="INBOXCRM_WEBHOOK_SECRET_GLOBEX"):
        configured_keys(Settings(env="local"))


def test_the_relay_metrics_listener_is_internal_by_default() -> None:
    settings = Settings()
    assert settings.relay_metrics_address == "127.0.0.1:9465"
    assert settings.relay_metrics_address != f"{settings.relay_host}:{settings.relay_port}"


def test_metrics_listener_serves_the_registry_from_memory() -> None:
    metrics = RelayMetrics()
    metrics.deliveries.labels("standard", "accepted").inc()
    port = free_port()
    server = metrics.serve(f"127.0.0.1:{port}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'inboxcrm_deliveries_received_total{outcome="accepted",source="standard"} 1.0' in text
    assert "inboxcrm_store_up 0.0" in text  # no refresh yet: no query was run for the scrape


# ------------------------------------------------------------------ credentials and tenants


def test_demo_policies_bind_the_shared_credentials() -> None:
    assert tenants_accepting("standard") == {"acme", "rehearsal", "initech"}
    assert tenants_accepting("postmark") == {"acme", "rehearsal"}
    assert tenants_accepting("mailgun") == {"acme", "rehearsal"}


def test_a_revoked_shared_credential_is_refused_within_the_recheck_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The relay reads the bindings from the re-checked policies, not from disk per request:
    a revocation holds once RECHECK_SECONDS have passed."""
    shutil.copytree(ROOT / "policies", tmp_path, dirs_exist_ok=True)
    monkeypatch.setenv("INBOXCRM_POLICY_DIR", str(tmp_path))
    assert "acme" in tenants_accepting("standard")
    policy = json.loads((tmp_path / "acme.json").read_text())
    policy["inbound_credentials"] = ["postmark"]
    (tmp_path / "acme.json").write_text(json.dumps(policy))
    later = time.monotonic() + policy_module.RECHECK_SECONDS + 0.1
    monkeypatch.setattr(policy_module.time, "monotonic", lambda: later)
    assert "acme" not in tenants_accepting("standard")
    assert "acme" in tenants_accepting("postmark")


def test_policy_rejects_an_unknown_credential_name(tmp_path: Path) -> None:
    policy = json.loads((ROOT / "policies" / "acme.json").read_text())
    policy["inbound_credentials"] = ["standard", "smtp"]
    (tmp_path / "acme.json").write_text(json.dumps(policy))
    with pytest.raises(PolicyError, match="inbound_credentials"):
        load_policies(tmp_path)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def test_standard_secret_decides_the_tenants_it_may_write() -> None:
    keys = configured_keys(Settings(webhook_secret=SHARED,
                                    webhook_tenant_secrets={"globex": GLOBEX}))
    now = int(time.time())
    body = b'{"tenant": "globex"}'
    for secret, allowed, refused in ((SHARED, "acme", "globex"), (GLOBEX, "globex", "acme")):
        headers = {"webhook-id": "msg_1", "webhook-timestamp": str(now),
                   "webhook-signature": sign(secret, "msg_1", now, body)}
        signed = signature_headers(headers, 300)
        assert signed is not None
        matched = matching_keys(keys, signed, body)
        assert len(matched) == 1
        check_tenant([k.binding() for k in matched], allowed)
        with pytest.raises(Forbidden):
            check_tenant([k.binding() for k in matched], refused)
    tampered = {"webhook-id": "msg_1", "webhook-timestamp": str(now),
                "webhook-signature": sign(GLOBEX, "msg_1", now, body)}
    signed = signature_headers(tampered, 300)
    assert signed is not None and matching_keys(keys, signed, body + b" ") == []
    stale = dict(tampered, **{"webhook-timestamp": str(now - 301)})
    assert signature_headers(stale, 300) is None
    assert signature_headers({"webhook-id": "m", "webhook-timestamp": str(now)}, 300) is None


def test_provider_tenant_comes_from_the_envelope_within_the_binding() -> None:
    shared = Binding.shared("postmark")  # acme and rehearsal
    assert resolve_recipient(shared, ["sales+x@acme.test"], []) == ("acme", "sales@acme.test")
    assert resolve_recipient(shared, ["inbox@rehearsal.test"], ["sales@acme.test"]) == (
        "rehearsal", "inbox@rehearsal.test")  # the header never overrides the envelope
    with pytest.raises(Forbidden):  # a tenant the credential is not bound to
        resolve_recipient(shared, ["hello@globex.test"], ["sales@acme.test"])
    with pytest.raises(BadRequest, match="unknown mailbox"):  # a To header cannot choose
        resolve_recipient(shared, ["abc123@inbound.postmarkapp.com"], ["sales@acme.test"])
    own = Binding.own("globex")
    assert resolve_recipient(own, ["abc123@inbound.postmarkapp.com"],
                             ["hello@globex.test"]) == ("globex", "hello@globex.test")
    with pytest.raises(BadRequest):  # within one tenant only: never another tenant's mailbox
        resolve_recipient(own, ["abc123@inbound.postmarkapp.com"], ["sales@acme.test"])
    with pytest.raises(Forbidden):
        resolve_recipient(Binding("mailgun", frozenset()), ["sales@acme.test"], [])


# ------------------------------------------------------------------ the streaming form reader

LIMITS = FormLimits(total_bytes=1_000_000, max_fields=50, part_bytes=10_000,
                    header_line_bytes=200, headers_per_part=4)


def multipart(parts: list[tuple[list[str], bytes]], boundary: str = "b0und") -> bytes:
    out = b""
    for headers, data in parts:
        out += f"--{boundary}\r\n".encode() + "".join(f"{h}\r\n" for h in headers).encode()
        out += b"\r\n" + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def field(name: str, value: bytes) -> tuple[list[str], bytes]:
    return [f'Content-Disposition: form-data; name="{name}"'], value


CT = "multipart/form-data; boundary=b0und"


def test_form_read_in_pieces_equals_the_form_read_whole() -> None:
    request = httpx.Request("POST", "http://relay/", data={"a": "1", "text": "ü\r\n--b"},
                            files={"f": ("n ü.bin", b"\x00\r\n--x\r\n", "application/pdf")})
    body, content_type = request.read(), request.headers["content-type"]
    whole = parse_form_bytes(content_type, body, LIMITS).to_form()
    reader = form_reader(content_type, LIMITS)
    for i in range(len(body)):
        reader.feed(body[i:i + 1])
    pieces = reader.close().to_form()
    assert whole == pieces
    assert whole.fields == {"a": ["1"], "text": ["ü\r\n--b"]}
    upload = whole.file("f")
    assert upload is not None and upload.data == b"\x00\r\n--x\r\n"
    assert (upload.filename, upload.content_type) == ("n ü.bin", "application/pdf")


@pytest.mark.parametrize(("body", "error", "words"), [
    (multipart([field("a", b"x" * 10_001)]), FormTooLarge, "exceeds 10000"),
    (multipart([field(f"f{i}", b"") for i in range(51)]), BadRequest, "more than 50 fields"),
    (multipart([(['Content-Disposition: form-data; name="a"; x="' + "y" * 300 + '"'], b"")]),
     BadRequest, "header line exceeds"),
    (multipart([(['Content-Disposition: form-data; name="a"'] + ["X-A: 1"] * 4, b"")]),
     BadRequest, "more than 4 header lines"),
    (multipart([(['Content-Disposition: form-data; name="a"',
                  "Content-Type: multipart/mixed; boundary=in"], b"--in\r\n\r\nx\r\n--in--")]),
     BadRequest, "nested multipart"),
    (multipart([(["Content-Type: text/plain"], b"no name")]), BadRequest, "form-data"),
    (multipart([field("a", b"1")])[:-10], BadRequest, "closing boundary"),
    (b"--b0und\r\n" + b"x" * 300, BadRequest, "header line exceeds"),
])
def test_form_limits_refuse_crafted_bodies(body: bytes, error: type[Exception],
                                           words: str) -> None:
    with pytest.raises(error, match=words):
        parse_form_bytes(CT, body, LIMITS)


def test_total_size_is_refused_while_reading() -> None:
    reader = form_reader(CT, FormLimits(total_bytes=1000))
    reader.feed(b"x" * 1000)
    with pytest.raises(FormTooLarge):
        reader.feed(b"x")


async def test_declared_length_over_the_limit_is_refused_unread() -> None:
    async def never() -> AsyncIterator[bytes]:
        raise AssertionError("the body was read")
        yield b""  # pragma: no cover

    with pytest.raises(FormTooLarge):
        await read_form(CT, str(20 * 1024 * 1024), never(), LIMITS)


def test_urlencoded_field_flood_stops_at_the_limit() -> None:
    reader = form_reader("application/x-www-form-urlencoded", LIMITS)
    with pytest.raises(BadRequest, match="more than 50 fields"):
        for _ in range(1000):
            reader.feed(b"a=1&" * 10)


def test_deeply_nested_form_is_refused_at_once_and_in_linear_time() -> None:
    """100,000 levels of multipart inside multipart (about 6 MB): refused at the first
    nested part header; and as an undeclared blob the same bytes are read in linear time."""
    depth = 100_000
    nested = b"".join(f"--n{i}\r\nContent-Type: multipart/mixed; boundary=n{i + 1}\r\n\r\n"
                      .encode() for i in range(depth))
    limits = FormLimits(total_bytes=50_000_000, part_bytes=50_000_000)
    declared = multipart([(['Content-Disposition: form-data; name="body-mime"',
                            "Content-Type: multipart/mixed; boundary=n0"], nested)])
    started = time.process_time()
    with pytest.raises(BadRequest, match="nested multipart"):
        parse_form_bytes(CT, declared, limits)
    undeclared = multipart([field("body-mime", nested)])
    form = parse_form_bytes(CT, undeclared, limits).to_form()
    assert time.process_time() - started < 1.0
    assert form.get("body-mime") == nested.decode()


def test_a_bad_boundary_is_refused() -> None:
    with pytest.raises(BadRequest):
        MultipartReader("", LIMITS)
    with pytest.raises(BadRequest):
        form_reader("multipart/form-data", LIMITS)
    with pytest.raises(BadRequest, match="form"):
        form_reader("application/json", LIMITS)


# ------------------------------------------------------------------ routes at the ASGI level


class Sent:
    """One request body, handed to the app chunk by chunk; counts what the app read."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.read = 0
        self.pending: bytes | None = next(chunks, None)

    async def receive(self) -> dict[str, Any]:
        chunk, self.pending = self.pending, None
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        self.pending = next(self.chunks, None)
        self.read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": self.pending is not None}


async def call(app: Any, path: str, headers: dict[str, str],
               chunks: Iterator[bytes]) -> tuple[int, bytes, int]:
    """(status, body, bytes of the request body the app read)."""
    sent = Sent(chunks)
    answer: dict[str, Any] = {"body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000),
             "server": ("127.0.0.1", 8080),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    await app(scope, sent.receive, send)
    return answer["status"], answer["body"], sent.read


def twenty_megabytes() -> Iterator[bytes]:
    for _ in range(320):
        yield b"t" * 65536


class NoLedger:
    """The ledger of an app whose lifespan has not run: these requests are refused before
    they reach it, and reaching it fails the test."""

    @property
    def pool(self) -> Any:
        raise AssertionError("the request reached the ledger")

    async def ingest(self, delivery: Any) -> Any:
        raise AssertionError("the request reached the ledger")


def relay(**values: Any) -> Any:
    app = create_app(Settings(env="local", **values))
    app.state.metrics = RelayMetrics()  # what the lifespan sets; the routes count into it
    app.dependency_overrides[get_ingestor] = NoLedger
    return app


async def test_a_20_mb_login_body_is_refused_unread() -> None:
    app = relay(review_token=SecretStr(LONG))
    declared = {"content-type": "application/x-www-form-urlencoded",
                "content-length": str(20 * 1024 * 1024)}
    status, _, read = await call(app, "/review/login", declared, twenty_megabytes())
    assert (status, read) == (413, 0)
    # No Content-Length (chunked): refused as soon as the running count passes the cap.
    chunked = {"content-type": "application/x-www-form-urlencoded"}
    status, _, read = await call(app, "/review/login", chunked, twenty_megabytes())
    assert status == 413 and read <= MAX_LOGIN_BYTES + 65536


@pytest.mark.parametrize("path", ["/v1/inbound/standard", "/v1/inbound/postmark",
                                  "/v1/inbound/mailgun"])
async def test_a_source_without_a_credential_answers_401_unread(path: str) -> None:
    status, body, read = await call(relay(), path, {"content-type": "application/json"},
                                    twenty_megabytes())
    assert (status, read) == (401, 0)
    assert json.loads(body)["status"] == "error"


async def test_unsigned_standard_and_postmark_requests_are_refused_unread() -> None:
    app = relay(webhook_secret=SHARED, postmark_user="pm", postmark_password=SecretStr(LONG))
    status, _, read = await call(app, "/v1/inbound/standard",
                                 {"content-type": "application/json"}, twenty_megabytes())
    assert (status, read) == (401, 0)
    status, _, read = await call(app, "/v1/inbound/postmark",
                                 {"authorization": "Basic " + base64.b64encode(
                                     b"pm:wrong").decode()}, twenty_megabytes())
    assert (status, read) == (401, 0)


async def test_a_nested_mailgun_form_is_refused_at_its_first_nested_part() -> None:
    app = relay(mailgun_signing_key=SecretStr(LONG))
    head = multipart([(['Content-Disposition: form-data; name="body-mime"',
                        "Content-Type: multipart/mixed; boundary=n0"], b"")])[:-12]

    def body() -> Iterator[bytes]:
        yield head
        yield from twenty_megabytes()

    status, answer, read = await call(app, "/v1/inbound/mailgun", {"content-type": CT}, body())
    assert status == 422 and b"nested multipart" in answer
    assert read < 100_000  # stopped at the first chunk


async def test_the_public_port_has_no_metrics() -> None:
    status, _, _ = await call(relay(), "/metrics", {}, iter([]))
    assert status in (404, 405)


def test_start_warns_about_disabled_and_unbound_sources(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with caplog.at_level("WARNING"):
        relay()
    disabled = " ".join(r.getMessage() for r in caplog.records)
    for source in ("standard", "postmark", "mailgun"):
        assert f"{source} source disabled" in disabled
    caplog.clear()
    monkeypatch.setenv("INBOXCRM_WEBHOOK_SECRET_NOBODY", GLOBEX)
    with caplog.at_level("WARNING"):
        relay()
    assert "'standard:nobody' is bound to no tenant" in caplog.text


async def test_deeply_nested_json_from_an_authenticated_sender_is_a_422() -> None:
    app = relay(webhook_secret=SHARED, postmark_user="pm", postmark_password=SecretStr(LONG))
    body = b"[" * 200_000 + b"]" * 200_000
    now = int(time.time())
    signed = {"content-type": "application/json", "webhook-id": "msg_deep",
              "webhook-timestamp": str(now), "webhook-signature": sign(SHARED, "msg_deep", now,
                                                                      body)}
    status, answer, _ = await call(app, "/v1/inbound/standard", signed, iter([body]))
    assert status == 422 and b"JSON" in answer
    basic = {"content-type": "application/json",
             "authorization": "Basic " + base64.b64encode(f"pm:{LONG}".encode()).decode()}
    status, answer, _ = await call(app, "/v1/inbound/postmark", basic, iter([body]))
    assert status == 422 and b"JSON" in answer


async def test_the_api_docs_are_served_only_by_the_local_stack() -> None:
    """`/docs` and `/openapi.json` describe every route to whoever asks: a deployment serves
    neither (docs/architecture.md §10 documents the interfaces)."""
    local = relay()
    deployed = create_app(Settings(env="production", mail_from="Sales <sales@example.com>"))
    deployed.state.metrics = RelayMetrics()
    for path in ("/docs", "/openapi.json", "/redoc"):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=local),
                                     base_url="http://relay") as http:
            assert (await http.get(path)).status_code == 200, path
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=deployed),
                                     base_url="http://relay") as http:
            assert (await http.get(path)).status_code == 404, path


async def test_large_bodies_are_hashed_a_bounded_number_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each large body is hashed once per configured secret before anything is decided:
    at most HASH_SLOTS of them at once per relay, and a delivery that finds no room in time
    is answered 503 with Retry-After (a provider retries it), not queued without end."""
    from inboxcrm.ingress.sources import standard
    from inboxcrm.ingress.sources.base import Busy

    monkeypatch.setattr(standard, "HASH_WAIT_SECONDS", 0.5)
    running, most = 0, 0
    release = threading.Event()
    real = standard.matching_keys

    def counted(*args: Any) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        release.wait(5)
        running -= 1
        return real(*args)

    monkeypatch.setattr(standard, "matching_keys", counted)
    source = standard.StandardSource(Settings(env="local", webhook_secret=SHARED,
                                              webhook_tenant_secrets={"globex": GLOBEX}))
    now = int(time.time())
    body = b"x" * (1024 * 1024)
    signed = standard.signature_headers(
        {"webhook-id": "msg_1", "webhook-timestamp": str(now),
         "webhook-signature": sign(SHARED, "msg_1", now, body)}, 300)
    assert signed is not None
    tasks = [asyncio.create_task(source.verify(signed, body)) for _ in range(6)]
    done = await asyncio.gather(*tasks[2:], return_exceptions=True)
    assert all(isinstance(result, Busy) for result in done)  # no room within the wait
    release.set()
    proofs = await asyncio.gather(*tasks[:2])
    assert most == standard.HASH_SLOTS
    assert all(len(proof.bindings) == 1 for proof in proofs)


async def test_the_unsubscribe_handlers_are_callable_without_a_relay() -> None:
    """The link's handlers are methods (issue 33): a forged or foreign link is "unknown",
    a valid one gets the confirmation form (a GET changes nothing), all without a database
    or a running relay."""
    import uuid

    from inboxcrm.domain.unsubscribe_links import make_token
    from inboxcrm.ingress.unsubscribe import UnsubscribeLinks

    links = UnsubscribeLinks(Settings(env="local", unsubscribe_secret=SecretStr(LONG)))
    valid = make_token(LONG, "acme", uuid.uuid4())
    assert (await links.confirm(valid)).status_code == 200
    assert (await links.confirm(valid[:-2] + "xx")).status_code == 404
    foreign = make_token("y" * 40, "acme", uuid.uuid4())
    assert (await links.confirm(foreign)).status_code == 404
    unconfigured = UnsubscribeLinks(Settings(env="local"))
    assert (await unconfigured.confirm(valid)).status_code == 404
