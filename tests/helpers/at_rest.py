"""Reading what the stack's processes sealed at rest (inboxcrm/platform/atrest.py) with the
stack's own keyring, as a reader in one of its processes would."""

from __future__ import annotations

import os

from inboxcrm.platform import atrest
from inboxcrm.stack.stack import Stack


def opened(stack: Stack, value: bytes | memoryview, *, row: str, tenant: str = "acme",
           column: str = atrest.RAW) -> bytes:
    """The plaintext of a stored value of row `row` (its event ID); the test fails if the
    value was not sealed."""
    sealer = atrest.sealer_for(stack.settings())
    assert sealer is not None, "the stack runs with a key file"
    assert atrest.is_sealed(value), f"{column} is stored in plaintext"
    return sealer.open(bytes(value), tenant=tenant, column=column, row=row)


def v1_sealed(sealer: atrest.Sealer, value: bytes, *, tenant: str, column: str) -> bytes:
    """A value as envelope version 1 sealed it, before rows were bound: tenant and column
    are its associated data, not the row."""
    head = atrest.header(sealer.active, atrest.V1)
    nonce = os.urandom(12)
    name = tenant.encode()
    aad = head + len(name).to_bytes(2, "big") + name + column.encode()
    return head + nonce + sealer._cipher(sealer.active, tenant).encrypt(nonce, value, aad)
