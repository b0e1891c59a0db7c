"""The codec keyed per tenant (inboxcrm/platform/codec.py, docs/architecture.md §7): a payload
of a tenant's workflow is sealed with that tenant's key and labelled with it; relabelled to
another tenant it fails authentication; the endpoint's `decrypt_for` opens only the tenants a
caller may see. Through the SDK's own data converter, as the worker and the relay use it."""

from __future__ import annotations

import dataclasses
import os

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    WorkflowSerializationContext,
)

from inboxcrm.platform.codec import (
    CodecError,
    EncryptionCodec,
    Keyring,
    tenant_of_workflow,
)

KEYS = Keyring("k1", {"k1": os.urandom(32), "k2": os.urandom(32)})
ACME_ITEM = WorkflowSerializationContext(namespace="default",
                                         workflow_id="inbound/acme/standard/sales@acme.test/E-1")
GLOBEX_STEP = ActivitySerializationContext(
    namespace="default", activity_id="1", activity_type="match_and_plan",
    activity_task_queue="inboxcrm", workflow_id="mailbox/globex/imap/sales@globex.test/INBOX",
    workflow_type="MailboxWatchWorkflow", is_local=True)


def converter() -> DataConverter:
    return dataclasses.replace(DataConverter.default, payload_codec=EncryptionCodec(KEYS))


@pytest.mark.parametrize(("workflow_id", "tenant"), [
    ("inbound/acme/standard/sales@acme.test/E-1", "acme"),
    ("mailbox/globex-eu/gmail/sales@globex.test/INBOX", "globex-eu"),
    ("drift-check", None), ("retention", None), (None, None),
    ("inbound/Not A Tenant/x", None), ("inboundx/acme/y", None),
])
def test_the_tenant_comes_from_the_workflow_id(workflow_id: str | None,
                                               tenant: str | None) -> None:
    assert tenant_of_workflow(workflow_id) == tenant


async def test_a_tenants_payloads_are_sealed_with_its_own_key_and_labelled() -> None:
    value = {"email": "jane@example.com"}
    acme = converter().with_context(ACME_ITEM)
    sealed = await acme.encode([value])
    assert sealed[0].metadata["encryption-tenant"] == b"acme"
    assert b"jane@example.com" not in sealed[0].SerializeToString()
    # Any process decodes it, with or without a context: the label says whose key.
    assert await converter().decode(sealed, [dict]) == [value]
    assert await converter().with_context(GLOBEX_STEP).decode(sealed, [dict]) == [value]
    globex = await converter().with_context(GLOBEX_STEP).encode([value])
    assert globex[0].metadata["encryption-tenant"] == b"globex"
    plain = await converter().encode([value])
    assert "encryption-tenant" not in plain[0].metadata


async def test_relabelled_or_unlabelled_a_tenants_payload_fails_authentication() -> None:
    codec = EncryptionCodec(KEYS)
    sealed = (await codec.for_tenant("acme").encode([Payload(data=b"private")]))[0]
    relabelled, unlabelled = Payload(), Payload()
    relabelled.CopyFrom(sealed)
    relabelled.metadata["encryption-tenant"] = b"globex"
    unlabelled.CopyFrom(sealed)
    del unlabelled.metadata["encryption-tenant"]
    for bad in (relabelled, unlabelled):
        with pytest.raises(CodecError) as caught:
            await codec.decode([bad])
        assert "private" not in str(caught.value)
    # A payload of no tenant cannot be passed off as a tenant's either.
    shared = (await codec.encode([Payload(data=b"private")]))[0]
    shared.metadata["encryption-tenant"] = b"acme"
    with pytest.raises(CodecError):
        await codec.decode([shared])


async def test_decrypt_for_opens_only_the_tenants_named() -> None:
    codec = EncryptionCodec(KEYS)
    acme = (await codec.for_tenant("acme").encode([Payload(data=b"a")]))[0]
    globex = (await codec.for_tenant("globex").encode([Payload(data=b"g")]))[0]
    system = (await codec.encode([Payload(data=b"s")]))[0]

    opened = codec.decrypt_for([acme, globex, system], frozenset({"acme"}))
    assert opened[0].data == b"a"
    assert opened[1] == globex and opened[2] == system  # still sealed
    assert [p.data for p in codec.decrypt_for([acme, globex, system], None)] == [
        b"a", b"g", b"s"]


async def test_a_made_up_tenant_label_is_refused_and_labels_cannot_grow_the_cache() -> None:
    codec = EncryptionCodec(KEYS)
    sealed = (await codec.for_tenant("acme").encode([Payload(data=b"private")]))[0]
    sealed.metadata["encryption-tenant"] = b"Not A Tenant!"
    with pytest.raises(CodecError):
        await codec.decode([sealed])
    for n in range(5000):  # labels a caller made up: each fails, the cache stays bounded
        forged = Payload()
        forged.CopyFrom(sealed)
        forged.metadata["encryption-tenant"] = f"t{n}".encode()
        with pytest.raises(CodecError):
            await codec.decode([forged])
    assert len(codec._tenant_ciphers) <= 4096


def test_one_scoped_codec_per_tenant_is_kept_and_the_keep_is_bounded() -> None:
    """The SDK asks for a codec per activation and step: the tenant's copy is made once."""
    codec = EncryptionCodec(KEYS)
    acme = codec.with_context(ACME_ITEM)
    assert acme.tenant == "acme" and codec.tenant is None
    assert codec.with_context(ACME_ITEM) is acme
    assert acme.for_tenant("globex") is codec.with_context(GLOBEX_STEP)
    assert acme.for_tenant(None) is codec
    for n in range(5000):  # workflow IDs name tenants; whatever they name, the keep is bounded
        assert codec.for_tenant(f"t{n}").tenant == f"t{n}"
    assert len(codec._scoped) <= 4096
