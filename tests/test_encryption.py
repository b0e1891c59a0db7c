"""Payload encryption (docs/architecture.md §7): the Temporal server never holds clear payloads.

End to end on the real stack (the worker, relay and CLI all encrypt with the stack's key file),
plus unit tests of the codec, the key file and the codec endpoint."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from google.protobuf import json_format
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload, Payloads, WorkflowExecution
from temporalio.api.enums.v1 import EventType, WorkflowExecutionStatus
from temporalio.api.failure.v1 import Failure
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryRequest
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError

from inboxcrm.ingress import codec as codec_server
from inboxcrm.platform import codec
from inboxcrm.platform.codec import CodecError, EncryptionCodec, Keyring, UnknownKeyError
from inboxcrm.platform.config import Settings
from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email

ENCRYPTED = b"binary/encrypted"
UI_ORIGIN = "http://127.0.0.1:8233"


# --- helpers ---------------------------------------------------------------------------
def stack_settings(stack: Stack) -> Settings:
    return Settings(codec_keys_file=stack.env["INBOXCRM_CODEC_KEYS_FILE"])


async def codec_client(stack: Stack) -> Client:
    return await Client.connect(stack.temporal_address,
                                data_converter=codec.data_converter(stack_settings(stack)))


async def wait_closed(client: Client, workflow_id: str, timeout: float = 60) -> None:
    handle = client.get_workflow_handle(workflow_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        described = await handle.describe()
        if described.raw_description.workflow_execution_info.status != \
                WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{workflow_id} still running")


async def raw_history(stack: Stack, workflow_id: str) -> tuple[bytes, list[Any]]:
    """The history exactly as the server stores and serves it: a client with NO codec, and
    the serialized response bytes of every page."""
    plain = await Client.connect(stack.temporal_address)
    blobs: list[bytes] = []
    events: list[Any] = []
    token = b""
    while True:
        page = await plain.workflow_service.get_workflow_execution_history(
            GetWorkflowExecutionHistoryRequest(
                namespace="default", execution=WorkflowExecution(workflow_id=workflow_id),
                next_page_token=token))
        blobs.append(page.SerializeToString())
        events.extend(page.history.events)
        token = page.next_page_token
        if not token:
            break
    # fetch_history() (the SDK's typed view) sees the same events.
    fetched = await plain.get_workflow_handle(workflow_id).fetch_history()
    assert len(fetched.events) == len(events)
    return b"".join(blobs), events


def walk(message: Message, path: str = "",
         skip: frozenset[str] = frozenset({"search_attributes"})
         ) -> Iterator[tuple[str, Message]]:
    """Every sub-message of `message` (itself included) with its field path, skipping indexed
    search attributes, which are deliberately plain (state and reason codes, no personal data)."""
    yield path, message
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE or field.name in skip:
            continue
        if field.message_type.GetOptions().map_entry:
            items = [(f"{field.name}[{key}]", item) for key, item in value.items()]
        elif field.is_repeated:
            items = [(f"{field.name}[{i}]", item) for i, item in enumerate(value)]
        else:
            items = [(field.name, value)]
        for name, item in items:
            if isinstance(item, Message):
                yield from walk(item, f"{path}.{name}", skip)


def payloads_of(events: list[Any]) -> list[Payload]:
    return [m for event in events for _, m in walk(event) if isinstance(m, Payload)]


# The SDK core writes its own bookkeeping for a local activity (sequence number, attempt,
# activity type and ID, times) as a plain marker detail, outside the data converter. The local
# activity's input never reaches history and its result (details[result]) is encrypted.
LOCAL_ACTIVITY_MARKER = ".marker_recorded_event_attributes.details[data]"
LOCAL_ACTIVITY_FIELDS = {"seq", "attempt", "activity_id", "activity_type", "complete_time",
                         "backoff", "original_schedule_time", "activation_index"}
# Likewise a `workflow.patched` marker: the patch ID (a code identifier) and a flag.
PATCH_MARKER = ".marker_recorded_event_attributes.details[patch-data]"
PATCH_FIELDS = {"id", "deprecated"}


def clear_payloads(events: list[Any]) -> list[str]:
    """Where a payload that is not encrypted sits in the history (empty when all are)."""
    found = []
    for event in events:
        for path, m in walk(event):
            if not isinstance(m, Payload) or m.metadata.get("encoding") == ENCRYPTED:
                continue
            if path.startswith(LOCAL_ACTIVITY_MARKER) and \
                    set(json.loads(m.data)) <= LOCAL_ACTIVITY_FIELDS:
                continue
            if path.startswith(PATCH_MARKER) and set(json.loads(m.data)) <= PATCH_FIELDS:
                continue
            found.append(f"{EventType.Name(event.event_type)}{path}")
    return found


def failures_of(events: list[Any]) -> list[Failure]:
    return [m for event in events for _, m in walk(event) if isinstance(m, Failure)]


def keyring(active: str, *ids: str) -> Keyring:
    return Keyring(active, {key_id: os.urandom(32) for key_id in ids})


# --- end to end on the real stack ------------------------------------------------------
async def test_history_on_the_server_holds_no_clear_personal_data(
    env: StackClient, stack: Stack,
) -> None:
    tag = uuid.uuid4().hex[:8]
    email = unique_email("secret")
    name = "Perpetua Quillfeather"
    subject = f"Pricing for 20 seats {tag}"
    sentence = "Our marmalade orchid studio is growing fast"
    body = (f"Hi, could you send me pricing for 20 seats? {sentence}.\n\n"
            f"Thanks,\n{name}\nExample Corp\n")
    workflow_id = await env.deliver(message_from(email, name=name, subject=subject, body=body),
                                    f"E-enc-{tag}")
    assert await env.wait_state(workflow_id, "completed") == ("completed", "followup_sent")
    client = await codec_client(stack)
    await wait_closed(client, workflow_id)

    history, events = await raw_history(stack, workflow_id)
    lowered = history.lower()
    for secret in (email, email.split("@")[0], name, "Quillfeather", subject, sentence,
                   "could you send me pricing"):
        assert secret.lower().encode() not in lowered, f"{secret!r} is in clear in the history"

    assert clear_payloads(events) == []
    payloads = [p for p in payloads_of(events) if p.metadata.get("encoding") == ENCRYPTED]
    assert len(payloads) >= 8  # workflow input, activity inputs and results, the result
    assert all(p.metadata.get("encryption-key-id") for p in payloads)
    # Each sealed with acme's own key, labelled so (the SDK's serialization context).
    assert {p.metadata.get("encryption-tenant") for p in payloads} == {b"acme"}
    started = next(e for e in events
                   if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED)
    workflow_input = started.workflow_execution_started_event_attributes.input.payloads[0]
    assert workflow_input.metadata["encoding"] == ENCRYPTED

    # Readable through the relay's codec endpoint (what the Temporal UI calls), over HTTP.
    response = await env.http.post(
        f"{stack.relay_url}/codec/decode",
        content=json_format.MessageToJson(Payloads(payloads=[workflow_input, *payloads])),
        headers={"content-type": "application/json", "x-namespace": "default",
                 "origin": UI_ORIGIN})
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == UI_ORIGIN
    decoded = json_format.Parse(response.text, Payloads()).payloads
    assert decoded[0].metadata["encoding"] == b"json/plain"
    start_input = json.loads(decoded[0].data)
    assert {"event_id", "tenant"} <= set(start_input)
    assert start_input["tenant"] == "acme"
    assert all(p.metadata.get("encoding") != ENCRYPTED for p in decoded)
    readable = b"\n".join(p.data for p in decoded)
    assert start_input["event_id"].encode() in readable and b'"state":"completed"' in readable

    # The raw JSON wire shape of the contract (base64 metadata and data) works as well.
    wire = {"payloads": [{"metadata": {k: base64.b64encode(v).decode()
                                       for k, v in workflow_input.metadata.items()},
                          "data": base64.b64encode(workflow_input.data).decode()}]}
    again = await env.http.post(f"{stack.relay_url}/codec/decode", json=wire,
                                headers={"x-namespace": "default"})
    assert again.status_code == 200
    first = again.json()["payloads"][0]
    assert json.loads(base64.b64decode(first["data"]))["event_id"] == start_input["event_id"]


async def test_failure_messages_are_encoded_in_history(env: StackClient, stack: Stack) -> None:
    email = unique_email("encfail")
    await env.inject("crm.upsert", "invalid_field")
    workflow_id = await env.deliver(message_from(email))
    assert (await env.wait_state(workflow_id, "blocked"))[0] == "blocked"
    client = await codec_client(stack)
    note = f"Spoke to Perpetua Quillfeather on +1 555 0100 ({email})"
    await client.get_workflow_handle(workflow_id).signal("reject", {"reviewer": "t",
                                                                    "note": note})
    await env.wait_state(workflow_id, "rejected")
    await wait_closed(client, workflow_id)

    history, events = await raw_history(stack, workflow_id)
    # The step's failure: on an ActivityTaskFailed event (regular activity) or on the local
    # activity's marker.
    failed = failures_of([e for e in events if e.event_type in (
        EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_MARKER_RECORDED)])
    assert failed, "the CRM step should have failed once"
    keys = codec.load_keyring(stack_settings(stack))
    assert keys is not None
    messages = [json.loads(p.data)["message"] for p in await EncryptionCodec(keys).decode(
        [f.encoded_attributes for f in failed])]
    assert "permanent: http_400:VALIDATION_ERROR" in messages
    # The reason code of a classified failure stays readable (the UI's history rows show it);
    # stack traces and every other message are sealed.
    assert b"Traceback" not in history and b"activities/" not in history
    for failure in failures_of(events):
        assert failure.message in ("Encoded failure", "permanent: http_400:VALIDATION_ERROR")
        assert failure.stack_trace == ""
        assert failure.encoded_attributes.metadata["encoding"] == ENCRYPTED
    assert clear_payloads(events) == []
    # The reviewer's note is in the history (the signal's input) but only as ciphertext.
    assert note.encode() not in history and b"Quillfeather" not in history
    assert email.encode() not in history
    signalled = next(e.workflow_execution_signaled_event_attributes.input.payloads[0]
                     for e in events
                     if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
    assert json.loads((await EncryptionCodec(keys).decode([signalled]))[0].data)["note"] == note


def test_stack_key_file_is_private_and_outside_the_repository(stack: Stack) -> None:
    path = Path(stack.env["INBOXCRM_CODEC_KEYS_FILE"])
    assert path.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stack.stack_env()["INBOXCRM_CODEC_KEYS_FILE"] == str(path)
    assert ".data" in path.parts  # git-ignored
    assert codec.load_keyring(stack_settings(stack)) is not None


# --- the codec ---------------------------------------------------------------------------
async def test_round_trip_through_the_data_converter(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    codec.ensure_key_file(keys_file)
    converter = codec.data_converter(Settings(codec_keys_file=str(keys_file)))
    value = {"email": "jane@example.com", "note": "ünïcödé"}

    encoded = await converter.encode([value])
    assert encoded[0].metadata["encoding"] == ENCRYPTED
    assert b"jane@example.com" not in encoded[0].SerializeToString()
    assert await converter.decode(encoded, [dict]) == [value]


def test_no_key_file_means_plain_payloads() -> None:
    settings = Settings(codec_keys_file=None)
    assert codec.load_keyring(settings) is None
    assert codec.data_converter(settings) is DataConverter.default


async def test_rotation_old_and_new_keys_decrypt_new_payloads_use_the_active_key() -> None:
    old = keyring("k1", "k1")
    before = await EncryptionCodec(old).encode([Payload(data=b"old secret")])
    rotated = Keyring("k2", {**old.keys, "k2": os.urandom(32)})
    new_codec = EncryptionCodec(rotated)
    after = await new_codec.encode([Payload(data=b"new secret")])

    assert before[0].metadata["encryption-key-id"] == b"k1"
    assert after[0].metadata["encryption-key-id"] == b"k2"
    assert [p.data for p in await new_codec.decode(before + after)] == [b"old secret",
                                                                         b"new secret"]


def test_rotate_key_file_keeps_old_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    codec.ensure_key_file(path)
    first = json.loads(path.read_text())["active"]
    new_id = codec.rotate_key_file(path)
    document = json.loads(path.read_text())
    assert document["active"] == new_id != first
    assert set(document["keys"]) == {first, new_id}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_unknown_key_id_fails_naming_the_key_never_the_payload() -> None:
    sealed = await EncryptionCodec(keyring("retired", "retired")).encode(
        [Payload(data=b"very private body text")])
    with pytest.raises(UnknownKeyError) as caught:
        await EncryptionCodec(keyring("k2", "k2")).decode(sealed)
    assert "'retired'" in str(caught.value)
    assert "private" not in str(caught.value)
    assert caught.value.key_id == "retired"


async def test_tampered_or_relabelled_ciphertext_fails() -> None:
    keys = keyring("k1", "k1", "k2")
    subject = EncryptionCodec(keys)
    sealed = (await subject.encode([Payload(data=b"private")]))[0]

    flipped = Payload()
    flipped.CopyFrom(sealed)
    flipped.data = sealed.data[:-1] + bytes([sealed.data[-1] ^ 1])
    relabelled = Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata["encryption-key-id"] = b"k2"
    truncated = Payload()
    truncated.CopyFrom(sealed)
    truncated.data = sealed.data[:10]

    for bad in (flipped, relabelled, truncated):
        with pytest.raises(CodecError) as caught:
            await subject.decode([bad])
        assert "private" not in str(caught.value)


async def test_plain_payloads_pass_through_decode() -> None:
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"reviewer": "t"}')
    assert await EncryptionCodec(keyring("k1", "k1")).decode([plain]) == [plain]


async def test_failure_attributes_are_encoded(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    codec.ensure_key_file(keys_file)
    converter = codec.data_converter(Settings(codec_keys_file=str(keys_file)))
    failure = Failure()
    await converter.encode_failure(ApplicationError("customer jane@example.com said no"),
                                   failure)

    assert failure.message == "Encoded failure"
    assert b"jane@example.com" not in failure.SerializeToString()
    restored = await converter.decode_failure(failure)
    assert str(restored) == "customer jane@example.com said no"

    coded = Failure()
    await converter.encode_failure(ApplicationError(
        "permanent: http_400:VALIDATION_ERROR", type="PermanentError"), coded)
    assert coded.message == "permanent: http_400:VALIDATION_ERROR"  # a reason code, readable
    assert coded.stack_trace == "" and coded.encoded_attributes.data


def test_key_file_creation_is_private_and_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "codec-keys.json"
    codec.ensure_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    content = path.read_text()
    document = json.loads(content)
    assert len(base64.b64decode(document["keys"][document["active"]])) == 32
    codec.ensure_key_file(path)
    assert path.read_text() == content
    assert [p.name for p in path.parent.iterdir()] == ["codec-keys.json"]


def test_bad_key_files_are_clear_errors_without_key_material(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    cases = {
        "not json": "{",
        "short key": json.dumps({"active": "k1", "keys": {"k1": "c2hvcnQta2V5"}}),
        "not base64": json.dumps({"active": "k1", "keys": {"k1": "%%%%"}}),
        "missing active": json.dumps({"active": "k9",
                                      "keys": {"k1": base64.b64encode(b"A" * 32).decode()}}),
    }
    for case, text in cases.items():
        path.write_text(text)
        with pytest.raises(codec.KeyFileError) as caught:
            codec.load_keyring(Settings(codec_keys_file=str(path)))
        assert str(path) in str(caught.value), case
        assert "c2hvcnQta2V5" not in str(caught.value)
    with pytest.raises(codec.KeyFileError):
        codec.load_keyring(Settings(codec_keys_file=str(tmp_path / "missing.json")))


# --- the codec endpoint ----------------------------------------------------------------
def endpoint(settings: Settings) -> httpx.AsyncClient:
    app = FastAPI()
    app.include_router(codec_server.codec_router(settings))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://codec")


def endpoint_settings(tmp_path: Path, **overrides: Any) -> Settings:
    keys_file = tmp_path / "keys.json"
    codec.ensure_key_file(keys_file)
    values: dict[str, Any] = {"codec_keys_file": str(keys_file), "relay_host": "0.0.0.0",
                              "codec_token": "s3cret-token", "codec_namespaces": None,
                              "temporal_namespace": "default",
                              "env": "local"}  # the short token above is a test value
    values.update(overrides)
    return Settings(**values)


PLAIN = {"payloads": [{"metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
                       "data": base64.b64encode(b'{"event_id": "e-1"}').decode()}]}
AUTH = {"authorization": "Bearer s3cret-token", "x-namespace": "default"}


async def test_endpoint_cors_preflight(tmp_path: Path) -> None:
    async with endpoint(endpoint_settings(tmp_path)) as http:
        allowed = await http.options("/codec/decode", headers={
            "origin": UI_ORIGIN, "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,x-namespace,authorization"})
        foreign = await http.options("/codec/encode", headers={
            "origin": "http://evil.example", "access-control-request-method": "POST"})

    assert allowed.status_code in (200, 204)
    assert allowed.headers["access-control-allow-origin"] == UI_ORIGIN
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert set(allowed.headers["access-control-allow-headers"].split(",")) == {
        "content-type", "x-namespace", "authorization"}
    assert "access-control-allow-origin" not in foreign.headers


async def test_endpoint_requires_the_bearer_token(tmp_path: Path) -> None:
    async with endpoint(endpoint_settings(tmp_path)) as http:
        missing = await http.post("/codec/decode", json=PLAIN, headers={"x-namespace": "default"})
        wrong = await http.post("/codec/decode", json=PLAIN,
                                headers={**AUTH, "authorization": "Bearer nope"})
        encoded = await http.post("/codec/encode", json=PLAIN, headers=AUTH)
        decoded = await http.post("/codec/decode", json=encoded.json(), headers=AUTH)

    for refused in (missing, wrong):
        assert refused.status_code == 401
        assert refused.content == b""
    assert encoded.status_code == 200
    sealed = encoded.json()["payloads"][0]
    assert base64.b64decode(sealed["metadata"]["encoding"]) == ENCRYPTED
    assert decoded.status_code == 200
    assert decoded.json() == PLAIN


async def test_endpoint_without_token_is_open_only_on_loopback(tmp_path: Path) -> None:
    async with endpoint(endpoint_settings(tmp_path, codec_token=None)) as http:
        exposed = await http.post("/codec/decode", json=PLAIN)
    async with endpoint(endpoint_settings(tmp_path, codec_token=None,
                                          relay_host="127.0.0.1")) as http:
        local = await http.post("/codec/decode", json=PLAIN, headers={"host": "127.0.0.1:8080"})
    assert exposed.status_code == 401
    assert local.status_code == 200
    assert local.json() == PLAIN


async def test_endpoint_without_token_is_closed_outside_the_local_stack(tmp_path: Path) -> None:
    """A production relay bound to loopback (behind a same-pod proxy, a port-forward) is no
    reason to decrypt for anyone: without a credential it refuses."""
    async with endpoint(endpoint_settings(tmp_path, codec_token=None, relay_host="127.0.0.1",
                                          env="production")) as http:
        refused = await http.post("/codec/decode", json=PLAIN,
                                  headers={"host": "127.0.0.1:8080"})
    assert refused.status_code == 401
    assert b"e-1" not in refused.content


async def test_the_open_local_codec_refuses_a_rebound_host(tmp_path: Path) -> None:
    """DNS rebinding: a page of another site whose name now resolves to 127.0.0.1 reaches
    the loopback codec with its own name as Host; only loopback names are answered."""
    async with endpoint(endpoint_settings(tmp_path, codec_token=None,
                                          relay_host="127.0.0.1")) as http:
        rebound = await http.post("/codec/decode", json=PLAIN,
                                  headers={"host": "attacker.example:8080"})
        ipv6 = await http.post("/codec/decode", json=PLAIN, headers={"host": "[::1]:8080"})
        named = await http.post("/codec/decode", json=PLAIN, headers={"host": "localhost"})
    assert rebound.status_code == 403
    assert b"e-1" not in rebound.content
    assert (ipv6.status_code, named.status_code) == (200, 200)


async def test_endpoint_namespaces(tmp_path: Path) -> None:
    async with endpoint(endpoint_settings(tmp_path)) as http:
        unknown = await http.post("/codec/decode", json=PLAIN,
                                  headers={**AUTH, "x-namespace": "someone-else"})
        default = await http.post("/codec/decode", json=PLAIN, headers=AUTH)
    async with endpoint(endpoint_settings(tmp_path, codec_namespaces="prod,staging")) as http:
        listed = await http.post("/codec/decode", json=PLAIN,
                                 headers={**AUTH, "x-namespace": "staging"})
        unlisted = await http.post("/codec/decode", json=PLAIN, headers=AUTH)
    assert unknown.status_code == 403
    assert default.status_code == 200
    assert listed.status_code == 200
    assert unlisted.status_code == 403


async def test_endpoint_bad_input(tmp_path: Path) -> None:
    foreign = await EncryptionCodec(keyring("other", "other")).encode([Payload(data=b"private")])
    async with endpoint(endpoint_settings(tmp_path)) as http:
        garbage = await http.post("/codec/decode", content=b"{not json", headers=AUTH)
        unknown_key = await http.post(
            "/codec/decode", content=json_format.MessageToJson(Payloads(payloads=foreign)),
            headers=AUTH)
    assert garbage.status_code == 400
    assert unknown_key.status_code == 400
    assert "'other'" in unknown_key.json()["message"]
    assert "private" not in unknown_key.text
