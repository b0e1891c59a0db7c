"""Personal data encrypted at rest in the store (docs/architecture.md §7, "Privacy in the store").

The stored message (`inbound_events.raw`), the provider's own event (`provider_events.body`),
the quotes an extraction keeps as evidence and a reviewer's edited follow-up
(`followup_intents.draft_text`) are sealed by the process that writes them
(relay, worker) and opened by the process that reads them, so the database, its replicas and
its backups hold ciphertext. The keys are the Temporal payload codec's keyring
(`INBOXCRM_CODEC_KEYS_FILE`, inboxcrm/platform/codec.py): one file, one rotation.

Each tenant gets its own key, derived from a keyring key with HKDF-SHA256 (info
`inboxcrm at-rest v1`, NUL, the tenant), and the tenant, the column and the row's identity
(its primary key: the event ID of a message, its provider event and its evidence, the event
an audit entry is about, the intent of a draft) are associated data: a value copied into
another tenant's row, another column, or another row of the same tenant and column (another
person's message) fails authentication. Envelope version 1 (written before the row was bound)
bound tenant and column only; it is still read, and `inboxcrm keys reencrypt` rewrites it as
version 2.

Envelope (bytes; a text column holds `ixa1:` + base64 of it):

    MAGIC (4 bytes "\\x00IXA") | version (1) | key ID length (1) | key ID | nonce (12) | AES-GCM

The header (magic to key ID) is associated data too, so relabelling the key ID fails. A value
without the magic is plaintext (written before encryption was on, or with no key file) and is
read as it is; `inboxcrm keys reencrypt` seals it under the active key.

No key file: with INBOXCRM_ENV=production the relay and the worker refuse to start
(`require_sealer`); elsewhere values are stored in plaintext and they log that at start.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from inboxcrm.platform.codec import NONCE_BYTES, CodecError, KeyFileError, Keyring, load_keyring
from inboxcrm.platform.config import Settings, get_settings

log = logging.getLogger("inboxcrm.platform.atrest")

MAGIC = b"\x00IXA"
VERSION = 2  # the row's identity is associated data
V1 = 1  # tenant and column only: read, rewritten by `keys reencrypt`
TEXT_PREFIX = "ixa1:"
INFO = b"inboxcrm at-rest v1"

# The columns (the associated data says which one a value belongs to).
RAW = "inbound_events.raw"
PROVIDER_EVENT = "provider_events.body"
EVIDENCE = "inbound_events.extraction.evidence"
AUDIT_EVIDENCE = "audit_log.detail.evidence"
# a reviewer's edited follow-up (its `draft_sha256` is over the plaintext)
DRAFT = "followup_intents.draft_text"

# How much of a message the readers of its head look at (subject, own text, languages).
HEAD_BYTES = 64 * 1024


class SealedValueError(CodecError):
    """A stored value that cannot be opened. Messages name key IDs and columns, never data."""


def is_sealed(value: bytes | memoryview) -> bool:
    return bytes(value[:len(MAGIC)]) == MAGIC


def key_id_of(value: bytes) -> str | None:
    """The key ID a sealed value names (None: plaintext)."""
    if not is_sealed(value) or len(value) < len(MAGIC) + 2:
        return None
    length = value[len(MAGIC) + 1]
    return value[len(MAGIC) + 2:len(MAGIC) + 2 + length].decode("ascii", errors="replace")


def header(key_id: str, version: int = VERSION) -> bytes:
    """The envelope's header for a key: also what a value sealed under it starts with."""
    encoded = key_id.encode("ascii")
    return MAGIC + bytes((version, len(encoded))) + encoded


class Sealer:
    """AES-256-GCM under per-tenant keys derived from the keyring: seals with the active key,
    opens with any key listed. One AES-GCM operation per value; the derived keys are cached."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self._ciphers: dict[tuple[str, str], AESGCM] = {}
        self._active_header = header(keyring.active)

    @property
    def active(self) -> str:
        return self.keyring.active

    def _cipher(self, key_id: str, tenant: str) -> AESGCM:
        cipher = self._ciphers.get((key_id, tenant))
        if cipher is None:
            key = self.keyring.keys.get(key_id)
            if key is None:
                raise UnknownStoredKeyError(key_id, self.keyring.keys)
            derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                           info=INFO + b"\x00" + tenant.encode()).derive(key)
            cipher = self._ciphers[(key_id, tenant)] = AESGCM(derived)
        return cipher

    @staticmethod
    def _aad(head: bytes, tenant: str, column: str, row: str | None) -> bytes:
        """Version 1 (`row` None): header, tenant, column. Version 2: each part
        length-prefixed, then the row's identity."""
        name = tenant.encode()
        if row is None:
            return head + len(name).to_bytes(2, "big") + name + column.encode()
        where = column.encode()
        return (head + len(name).to_bytes(2, "big") + name + len(where).to_bytes(2, "big")
                + where + row.encode())

    def seal(self, value: bytes, *, tenant: str, column: str, row: str) -> bytes:
        """Sealed for this tenant, column and row (its primary key, as text)."""
        if not row:
            raise ValueError(f"{column}: a sealed value needs its row's identity")
        head = self._active_header
        nonce = os.urandom(NONCE_BYTES)
        return head + nonce + self._cipher(self.active, tenant).encrypt(
            nonce, value, self._aad(head, tenant, column, row))

    def open(self, value: bytes, *, tenant: str, column: str, row: str) -> bytes:
        """The plaintext of a sealed value; a plaintext value as it is. A version 1 value
        (not bound to its row) opens as before."""
        if not is_sealed(value):
            return value
        start = len(MAGIC) + 2
        if len(value) < start or value[len(MAGIC)] not in (V1, VERSION):
            raise SealedValueError(f"{column}: unknown at-rest envelope version")
        bound = None if value[len(MAGIC)] == V1 else row
        end = start + value[start - 1]
        key_id = value[start:end].decode("ascii", errors="replace")
        cipher = self._cipher(key_id, tenant)
        try:
            return cipher.decrypt(value[end:end + NONCE_BYTES], value[end + NONCE_BYTES:],
                                  self._aad(value[:end], tenant, column, bound))
        except (InvalidTag, ValueError):
            raise SealedValueError(
                f"{column}: value under key ID {key_id!r} failed authentication (tampered, "
                "another tenant's, column's or row's value, or different key material)"
            ) from None

    def is_current(self, value: bytes) -> bool:
        """Sealed under the active key in the current version already (`keys reencrypt`
        leaves it alone)."""
        return value.startswith(self._active_header)

    def seal_text(self, value: str, *, tenant: str, column: str, row: str) -> str:
        """A text value (a JSON string) sealed: `ixa1:` + base64 of the envelope."""
        sealed = self.seal(value.encode(), tenant=tenant, column=column, row=row)
        return TEXT_PREFIX + base64.b64encode(sealed).decode("ascii")

    def open_text(self, value: str, *, tenant: str, column: str, row: str) -> str:
        return self.open(text_envelope(value, column), tenant=tenant, column=column,
                         row=row).decode()


class UnknownStoredKeyError(SealedValueError):
    def __init__(self, key_id: str, known: Iterable[str]) -> None:
        self.key_id = key_id
        super().__init__(
            f"stored value was sealed with unknown key ID {key_id[:64]!r} (known key IDs: "
            f"{', '.join(sorted(known)) or 'none'}); add that key to INBOXCRM_CODEC_KEYS_FILE")


def sealer_for(settings: Settings) -> Sealer | None:
    """The sealer of these settings' keyring; None (plaintext) where no key file is set."""
    keyring = load_keyring(settings)
    return Sealer(keyring) if keyring is not None else None


@lru_cache(maxsize=1)
def process_sealer() -> Sealer | None:
    """The sealer of this process (its settings' keyring), loaded once."""
    return sealer_for(get_settings())


def require_sealer(settings: Settings) -> None:
    """At the start of a process that writes (relay, worker): with INBOXCRM_ENV=production no
    key file stops it here (`KeyFileError`), not at its first message; elsewhere it says once
    that values are kept in plaintext."""
    if settings.codec_keys_file:
        process_sealer()  # a malformed file stops the process now too
        return
    if settings.env == "production":
        raise KeyFileError("INBOXCRM_CODEC_KEYS_FILE is not set: with INBOXCRM_ENV=production "
                           "stored messages must be encrypted at rest (create the key file "
                           "with `inboxcrm keys rotate`, see docs/architecture.md §7)")
    log.warning("no INBOXCRM_CODEC_KEYS_FILE: stored messages, provider events and evidence "
                "are kept in plaintext (allowed only outside INBOXCRM_ENV=production)")


# --- the process's values --------------------------------------------------------------
def seal(value: bytes, *, tenant: str, column: str, row: str) -> bytes:
    sealer = process_sealer()
    return value if sealer is None else sealer.seal(value, tenant=tenant, column=column,
                                                    row=row)


def open_value(value: bytes | memoryview, *, tenant: str, column: str, row: str) -> bytes:
    value = bytes(value)
    if not is_sealed(value):
        return value
    sealer = process_sealer()
    if sealer is None:
        raise SealedValueError(f"{column}: value is sealed (key ID {key_id_of(value)!r}) but "
                               "no INBOXCRM_CODEC_KEYS_FILE is configured")
    return sealer.open(value, tenant=tenant, column=column, row=row)


def open_optional(value: bytes | memoryview | None, *, tenant: str, column: str, row: str
                  ) -> bytes | None:
    return None if value is None else open_value(value, tenant=tenant, column=column, row=row)


def open_head(value: bytes | memoryview | None, *, tenant: str, event_id: str
              ) -> bytes | None:
    """The first HEAD_BYTES of a stored message (None: purged)."""
    opened = open_optional(value, tenant=tenant, column=RAW, row=event_id)
    return None if opened is None else opened[:HEAD_BYTES]


def is_sealed_text(value: str) -> bool:
    return value.startswith(TEXT_PREFIX)


def text_envelope(value: str, column: str) -> bytes:
    """The envelope of a sealed text value (a plaintext value: its bytes)."""
    if not is_sealed_text(value):
        return value.encode()
    try:
        sealed = base64.b64decode(value[len(TEXT_PREFIX):], validate=True)
    except (ValueError, binascii.Error):
        raise SealedValueError(f"{column}: sealed text is not valid base64") from None
    if not is_sealed(sealed):
        raise SealedValueError(f"{column}: sealed text holds no at-rest envelope")
    return sealed


def seal_text(value: str | None, *, tenant: str, column: str, row: str) -> str | None:
    sealer = process_sealer()
    if value is None or sealer is None:
        return value
    return sealer.seal_text(value, tenant=tenant, column=column, row=row)


def open_text(value: str | None, *, tenant: str, column: str, row: str) -> str | None:
    if value is None or not is_sealed_text(value):
        return value
    return open_value(text_envelope(value, column), tenant=tenant, column=column,
                      row=row).decode()


# --- the evidence: the quotes an extraction keeps, in its record and its audit entry --------
EVIDENCE_FIELDS = ("sender_email", "contact_name", "company")


def map_evidence(extraction: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    """The extraction record with each field's evidence quote passed through `change`."""
    out = dict(extraction)
    for name in EVIDENCE_FIELDS:
        field = out.get(name)
        if isinstance(field, dict) and isinstance(field.get("evidence"), str):
            out[name] = {**field, "evidence": change(field["evidence"])}
    return out


def map_audit_evidence(detail: dict[str, Any], change: Callable[[str], str]) -> dict[str, Any]:
    """An `extracted` audit entry's detail with its evidence quotes passed through `change`."""
    quotes = detail.get("evidence")
    if not isinstance(quotes, dict):
        return detail
    return {**detail, "evidence": {k: change(v) if isinstance(v, str) else v
                                   for k, v in quotes.items()}}


def seal_evidence(extraction: dict[str, Any], *, tenant: str, event_id: str) -> dict[str, Any]:
    sealer = process_sealer()
    if sealer is None:
        return extraction
    return map_evidence(extraction, lambda q: sealer.seal_text(q, tenant=tenant,
                                                              column=EVIDENCE, row=event_id))


def open_evidence(extraction: dict[str, Any], *, tenant: str, event_id: str) -> dict[str, Any]:
    return map_evidence(extraction, lambda q: open_text(q, tenant=tenant, column=EVIDENCE,
                                                        row=event_id) or q)
