"""Reading what the stack's processes sealed at rest (inboxcrm/platform/atrest.py) with the
stack's own keyring, as a reader in one of its processes would."""

from __future__ import annotations

from inboxcrm.platform import atrest
from inboxcrm.stack.stack import Stack


def opened(stack: Stack, value: bytes | memoryview, *, tenant: str = "acme",
           column: str = atrest.RAW) -> bytes:
    """The plaintext of a stored value; the test fails if the value was not sealed."""
    sealer = atrest.sealer_for(stack.settings())
    assert sealer is not None, "the stack runs with a key file"
    assert atrest.is_sealed(value), f"{column} is stored in plaintext"
    return sealer.open(bytes(value), tenant=tenant, column=column)
