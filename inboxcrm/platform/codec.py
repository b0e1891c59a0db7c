"""Temporal payload encryption (docs/architecture.md §7) and the codec endpoint for the UI.

Every payload the worker, the relay and the CLI hand to Temporal is sealed with AES-256-GCM
before it leaves the process, so the Temporal server (and its database, backups and UI)
only ever holds ciphertext. Failure messages and stack traces are moved into an encoded
payload too (`DefaultFailureConverterWithEncodedAttributes`).

Keys live in a JSON file named by `INBOXCRM_CODEC_KEYS_FILE` (never in the repository;
`make up` creates `.data/codec-keys.json`, mode 0600):

    {"active": "k2", "keys": {"k1": "<base64 of 32 bytes>", "k2": "<base64 of 32 bytes>"}}

New payloads are encrypted with the active key; any listed key decrypts. Rotation: add a key,
make it active (`rotate_key_file`), restart the processes, and keep the old keys for as long as
histories written under them are retained. No key file configured: the codec is off.

Wire format of an encrypted payload: metadata `encoding: binary/encrypted` and
`encryption-key-id: <id>`; data `nonce (12 bytes) || AES-GCM(ciphertext || tag)` with the key
ID as associated data (so relabelling a payload with another key ID fails authentication).
The plaintext is the original serialized `Payload` (metadata included).

Keyed per tenant: a payload of a tenant's workflow (its ID `inbound/<tenant>/…` or
`mailbox/<tenant>/…`, which the SDK hands the codec as its serialization context) is sealed
with that tenant's own key, derived from the keyring's key by HKDF-SHA256 with the tenant in
its info, and carries `encryption-tenant: <tenant>`; the key ID and the tenant are its
associated data, so a payload relabelled to another tenant fails authentication. Payloads of
no tenant (the drift check, the retention run, a payload the UI encodes) use the key itself.
The codec endpoint opens only the payloads of the tenants the caller may see (an SSO token
naming tenant A leaves tenant B's payloads sealed). A tenant's name is no personal data: it is
a search attribute already.

The codec endpoint (`POST /codec/encode`, `POST /codec/decode`, Temporal codec-server
contract) lets the Temporal UI and `temporal --codec-endpoint` show readable history to
authorised operators: bearer token `INBOXCRM_CODEC_TOKEN`, required unless the relay listens on
loopback and no token is configured (local development).
"""

from __future__ import annotations

import base64
import binascii
import copy
import dataclasses
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.common import MetricCounter, MetricMeter
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
    PayloadConverter,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.exceptions import ApplicationError

from inboxcrm.platform.config import Settings
from inboxcrm.schemas.contract import DECISION_REFUSED
from inboxcrm.schemas.outcomes import ErrorType

log = logging.getLogger("inboxcrm.platform.codec")

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
TENANT_METADATA = "encryption-tenant"
# The workflows of one tenant: an item and a mailbox watcher (schemas.models.inbound_workflow_id,
# schemas.mailboxes.mailbox_workflow_id); the tenant pattern is the policy's.
_TENANT_OF_WORKFLOW = re.compile(r"^(?:inbound|mailbox)/([a-z0-9][a-z0-9_-]{0,63})/")
_TENANT_KEY_INFO = b"inboxcrm codec tenant v1\x00"
_TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# The derived ciphers kept per codec: far above any installation's tenants times keys, so a
# stream of payloads with made-up labels (the codec endpoint decodes what a caller sends)
# cannot grow the cache without bound.
_TENANT_CIPHERS_MAX = 4096
NONCE_BYTES = 12
KEY_BYTES = 32
_KEY_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class CodecError(ValueError):
    """A payload that cannot be decrypted. Messages name key IDs, never payload content."""


class UnknownKeyError(CodecError):
    def __init__(self, key_id: str, known: Iterable[str]) -> None:
        self.key_id = key_id
        super().__init__(
            f"payload was encrypted with unknown key ID {key_id!r} (known key IDs: "
            f"{', '.join(sorted(known)) or 'none'}); add that key to INBOXCRM_CODEC_KEYS_FILE"
        )


class KeyFileError(ValueError):
    """A missing or malformed key file. Messages name the file and key IDs, never key bytes."""


# --- keys ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Keyring:
    active: str
    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        if not self.keys:
            raise KeyFileError("the keyring holds no keys")
        for key_id, key in self.keys.items():
            if not _KEY_ID.match(key_id):
                raise KeyFileError(f"key ID {key_id[:64]!r} must be 1-64 characters of "
                                   "letters, digits and . _ : -")
            if len(key) != KEY_BYTES:
                raise KeyFileError(f"key {key_id!r} must be {KEY_BYTES} bytes (AES-256)")
        if self.active not in self.keys:
            raise KeyFileError(f"active key ID {self.active[:64]!r} is not among the keys")

    @classmethod
    def from_json(cls, document: Any, source: str = "key file") -> Keyring:
        if not isinstance(document, dict) or not isinstance(document.get("keys"), dict):
            raise KeyFileError(f"{source}: expected {{\"active\": ID, \"keys\": {{ID: base64}}}}")
        active = document.get("active")
        if not isinstance(active, str):
            raise KeyFileError(f"{source}: 'active' must be a key ID string")
        keys: dict[str, bytes] = {}
        for key_id, encoded in document["keys"].items():
            try:
                if not isinstance(encoded, str):
                    raise ValueError
                keys[str(key_id)] = base64.b64decode(encoded, validate=True)
            except (ValueError, binascii.Error):
                raise KeyFileError(f"{source}: key {str(key_id)[:64]!r} is not valid "
                                   "base64") from None
        try:
            return cls(active, keys)
        except KeyFileError as exc:
            raise KeyFileError(f"{source}: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return {"active": self.active,
                "keys": {k: base64.b64encode(v).decode() for k, v in self.keys.items()}}


def load_keyring(settings: Settings) -> Keyring | None:
    """The configured keyring, or None when no key file is configured (codec off)."""
    if not settings.codec_keys_file:
        return None
    path = Path(settings.codec_keys_file)
    try:
        text = path.read_text()
        mode = path.stat().st_mode
    except OSError as exc:
        raise KeyFileError(f"cannot read codec key file {path} ({type(exc).__name__}); "
                           "check INBOXCRM_CODEC_KEYS_FILE") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("codec key file %s is accessible to other users; chmod 600 it", path)
    try:
        document = json.loads(text)
    except ValueError:
        raise KeyFileError(f"codec key file {path} is not valid JSON") from None
    return Keyring.from_json(document, str(path))


def new_key_id() -> str:
    return f"k{time.strftime('%Y%m%d', time.gmtime())}-{secrets.token_hex(3)}"


def _write_private(path: Path, content: str, *, replace: bool) -> bool:
    """Write `content` to `path` with mode 0600, atomically. Without `replace`, an existing file
    is left alone (returns False), even if another process creates it at the same moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ensure_key_file(path: Path) -> None:
    """Create the key file with one fresh random key (mode 0600) unless it exists."""
    path = Path(path)
    if path.exists():
        return
    key_id = new_key_id()
    keyring = Keyring(key_id, {key_id: secrets.token_bytes(KEY_BYTES)})
    if _write_private(path, json.dumps(keyring.to_json(), indent=2) + "\n", replace=False):
        log.info("created codec key file %s (active key %s)", path, key_id)


def rotate_key_file(path: Path) -> str:
    """Add a fresh key and make it the active one; older keys stay for decryption.
    Returns the new key ID. Processes pick it up when restarted."""
    path = Path(path)
    current = Keyring.from_json(json.loads(path.read_text()), str(path))
    key_id = new_key_id()
    while key_id in current.keys:
        key_id = new_key_id()
    rotated = Keyring(key_id, {**current.keys, key_id: secrets.token_bytes(KEY_BYTES)})
    _write_private(path, json.dumps(rotated.to_json(), indent=2) + "\n", replace=True)
    return key_id


# --- the codec -------------------------------------------------------------------------
SCOPED_CACHE_LIMIT = 4096
def tenant_of_workflow(workflow_id: str | None) -> str | None:
    """The tenant whose workflow this is, from its ID; None for a workflow of no tenant."""
    found = _TENANT_OF_WORKFLOW.match(workflow_id or "")
    return found.group(1) if found else None


class EncryptionCodec(PayloadCodec, WithSerializationContext):
    """AES-256-GCM with a key ID per payload; encrypts with the active key, decrypts with any.
    Payloads without `binary/encrypted` pass through decode unchanged (e.g. a signal sent by a
    client that has no codec). With a tenant's workflow as its context (`with_context`), it
    seals with the tenant's key (module docstring).

    With a `meter` (the worker's metrics runtime) it counts the bytes it seals and opens
    (`inboxcrm_codec_bytes{direction}`, ciphertext sizes): the benchmark's bytes through the
    codec per item, and a capacity figure (docs/capacity.md)."""

    def __init__(self, keyring: Keyring, meter: MetricMeter | None = None) -> None:
        super().__init__()
        self.keyring = keyring
        self.tenant: str | None = None
        self._ciphers = {key_id: AESGCM(key) for key_id, key in keyring.keys.items()}
        # The tenants' derived ciphers, shared by every copy `with_context` makes.
        self._tenant_ciphers: dict[tuple[str, str], AESGCM] = {}
        # The scoped copies themselves, one per tenant, shared the same way: the SDK asks for
        # one on every activation and activity of an item (`with_context`).
        self._scoped: dict[str | None, EncryptionCodec] = {None: self}
        # Bound once per direction: attributes given on every `add` cost more than the add.
        self._sealed: MetricCounter | None = None
        self._opened: MetricCounter | None = None
        if meter is not None:
            counter = meter.create_counter(
                "inboxcrm_codec_bytes", "Payload bytes sealed (encode) and opened (decode) by "
                "the codec", "By")
            self._sealed = counter.with_additional_attributes({"direction": "encode"})
            self._opened = counter.with_additional_attributes({"direction": "decode"})

    def with_context(self, context: SerializationContext) -> EncryptionCodec:
        """This codec sealing for the tenant of the context's workflow (the SDK calls it for
        every conversion that belongs to a workflow or its activities)."""
        workflow_id = (context.workflow_id if isinstance(
            context, (WorkflowSerializationContext, ActivitySerializationContext)) else None)
        return self.for_tenant(tenant_of_workflow(workflow_id))

    def for_tenant(self, tenant: str | None) -> EncryptionCodec:
        """This codec sealing for `tenant` (None: the keyring's keys themselves)."""
        if tenant == self.tenant:
            return self
        scoped = self._scoped.get(tenant)
        if scoped is None:
            scoped = copy.copy(self)
            scoped.tenant = tenant
            if len(self._scoped) < SCOPED_CACHE_LIMIT:  # a tenant is a policy, not a request
                self._scoped[tenant] = scoped
        return scoped

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        sealed = [self.encrypt(p) for p in payloads]
        if self._sealed is not None and sealed:
            self._sealed.add(sum(len(p.data) for p in sealed))
        return sealed

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        if self._opened is not None and payloads:
            self._opened.add(sum(len(p.data) for p in payloads
                                 if p.metadata.get("encoding") == ENCODING))
        return [self.decrypt(p) for p in payloads]

    def _cipher(self, key_id: str, tenant: str | None) -> AESGCM:
        if tenant is None:
            return self._ciphers[key_id]
        cipher = self._tenant_ciphers.get((key_id, tenant))
        if cipher is None:
            if not _TENANT_NAME.match(tenant):
                raise CodecError("encrypted payload's tenant label is not a tenant name")
            if len(self._tenant_ciphers) >= _TENANT_CIPHERS_MAX:
                self._tenant_ciphers.clear()
            derived = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None,
                           info=_TENANT_KEY_INFO + tenant.encode()).derive(
                               self.keyring.keys[key_id])
            cipher = self._tenant_ciphers[(key_id, tenant)] = AESGCM(derived)
        return cipher

    def encrypt(self, payload: Payload) -> Payload:
        key_id = self.keyring.active
        nonce = os.urandom(NONCE_BYTES)
        metadata = {"encoding": ENCODING, KEY_ID_METADATA: key_id.encode()}
        associated = key_id.encode()
        if self.tenant is not None:
            metadata[TENANT_METADATA] = self.tenant.encode()
            associated += b"\x00" + self.tenant.encode()
        sealed = self._cipher(key_id, self.tenant).encrypt(
            nonce, payload.SerializeToString(), associated)
        return Payload(metadata=metadata, data=nonce + sealed)

    @staticmethod
    def tenant_of(payload: Payload) -> str | None:
        """The tenant a sealed payload belongs to (its metadata); None: no tenant's."""
        raw = payload.metadata.get(TENANT_METADATA)
        return None if raw is None else raw.decode("utf-8", errors="replace")[:64]

    def decrypt(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload
        raw_id = payload.metadata.get(KEY_ID_METADATA)
        if raw_id is None:
            raise CodecError(f"encrypted payload has no {KEY_ID_METADATA!r} metadata")
        key_id = raw_id.decode("utf-8", errors="replace")[:64]
        if key_id not in self._ciphers:
            raise UnknownKeyError(key_id, self._ciphers)
        tenant = self.tenant_of(payload)
        associated = raw_id if tenant is None else raw_id + b"\x00" + tenant.encode()
        data = payload.data
        try:
            plain = self._cipher(key_id, tenant).decrypt(
                data[:NONCE_BYTES], data[NONCE_BYTES:], associated)
            return Payload.FromString(plain)
        except (InvalidTag, ValueError, DecodeError):
            raise CodecError(f"payload under key ID {key_id!r} failed authentication "
                             "(tampered, truncated, or different key material)") from None

    def decrypt_for(self, payloads: Sequence[Payload], tenants: frozenset[str] | None
                    ) -> list[Payload]:
        """Open the payloads of these tenants (None: every payload, the operator's token);
        the others, a payload of no tenant included, are returned still sealed."""
        if tenants is None:
            return [self.decrypt(p) for p in payloads]
        return [self.decrypt(p) if self.tenant_of(p) in tenants else p for p in payloads]


def payload_codec(settings: Settings, meter: MetricMeter | None = None
                  ) -> EncryptionCodec | None:
    keyring = load_keyring(settings)
    return EncryptionCodec(keyring, meter) if keyring is not None else None


PLAIN_REASON_TYPES = frozenset({DECISION_REFUSED, *(t.value for t in ErrorType)})


class ReasonCodeFailureConverter(DefaultFailureConverterWithEncodedAttributes):
    """Every failure's message and stack trace are encrypted (an exception may quote data),
    except that the message of an `ApplicationError` whose type is in PLAIN_REASON_TYPES
    stays readable too: it is a payload-free reason code written by this project
    (`permanent: http_400:VALIDATION_ERROR`, a refused decision), so the UI's history rows and
    a refused update show the reason instead of "Encoded failure". Stack traces stay sealed."""

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter,
                   failure: Failure) -> None:
        super().to_failure(exception, payload_converter, failure)
        if isinstance(exception, ApplicationError) and exception.type in PLAIN_REASON_TYPES:
            failure.message = exception.message


def data_converter(settings: Settings, meter: MetricMeter | None = None) -> DataConverter:
    """The data converter every client and worker of this project uses (`meter`: count the
    codec's bytes on this metrics runtime)."""
    codec = payload_codec(settings, meter)
    if codec is None:
        return DataConverter.default
    return dataclasses.replace(
        DataConverter.default, payload_codec=codec,
        failure_converter_class=ReasonCodeFailureConverter,
    )


# --- the codec endpoint ----------------------------------------------------------------
