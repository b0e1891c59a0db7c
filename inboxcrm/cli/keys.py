"""The `keys` group: the keyring that seals Temporal payloads and the values stored at rest
(`INBOXCRM_CODEC_KEYS_FILE`, inboxcrm/platform/codec.py and atrest.py). `keys list` shows key
IDs (never key bytes), `keys rotate` adds a fresh active key, `keys reencrypt` seals a
tenant's stored messages, provider events, evidence and edited drafts again under the active
key, so an old key can leave the file (docs/architecture.md §7, "Key rotation")."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import asyncpg
import typer

from inboxcrm.cli.common import JsonOpt, fail, out, progress, settings_from_env, with_db
from inboxcrm.platform import atrest
from inboxcrm.platform.codec import KeyFileError, ensure_key_file, load_keyring, rotate_key_file
from inboxcrm.store import sealed

keys_app = typer.Typer(no_args_is_help=True, help="Encryption keys: list, rotate, re-encrypt.")

MAX_BATCH = 5_000


def _key_file() -> Path:
    settings = settings_from_env()
    if not settings.codec_keys_file:
        fail("INBOXCRM_CODEC_KEYS_FILE is not set (the local stack sets it in .data/stack.env)",
             2)
    return Path(str(settings.codec_keys_file))


@keys_app.command("list")
def list_keys(as_json: JsonOpt = False) -> None:
    """The key IDs in the key file and the active one (never key material)."""
    settings = settings_from_env()
    try:
        keyring = load_keyring(settings)
    except KeyFileError as exc:
        fail(str(exc), 2)
        raise
    if keyring is None:
        fail("INBOXCRM_CODEC_KEYS_FILE is not set", 2)
        raise SystemExit(2)
    found = {"active": keyring.active, "keys": sorted(keyring.keys)}
    if as_json:
        out.print_json(json.dumps(found))
    else:
        for key_id in found["keys"]:
            out.print(f"{key_id}{'  (active)' if key_id == keyring.active else ''}")


@keys_app.command()
def rotate(as_json: JsonOpt = False) -> None:
    """Add a fresh key and make it the active one (the file is created if missing). Restart
    the relay and workers so they seal with it, then run `keys reencrypt`; keep the old key
    while Temporal histories or stored values still need it."""
    path = _key_file()
    created = not path.exists()
    try:
        if created:
            ensure_key_file(path)
            key_id = json.loads(path.read_text())["active"]
        else:
            key_id = rotate_key_file(path)
    except (KeyFileError, OSError, ValueError) as exc:
        fail(f"cannot rotate {path}: {exc}", 2)
        raise
    if as_json:
        out.print_json(json.dumps({"active": key_id, "created": created}))
    else:
        out.print(f"{'created' if created else 'rotated'} {path}: active key {key_id}; restart "
                  "the relay and workers, then run `inboxcrm keys reencrypt`")


@keys_app.command()
def reencrypt(
    tenant: Annotated[str | None, typer.Option(help="Default: every tenant with a policy.")
                      ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, max=MAX_BATCH,
                                            help="Values per transaction.")] = 500,
    as_json: JsonOpt = False,
) -> None:
    """Seal a tenant's stored messages, provider events, evidence quotes and edited drafts
    again under the active key, in
    bounded batches (one transaction and one `reencrypted` audit entry each). Run it again to
    resume: values already under the active key are left alone. Prints the counts."""
    from inboxcrm.domain.policy import load_policies

    settings = settings_from_env()
    try:
        sealer = atrest.sealer_for(settings)
    except KeyFileError as exc:
        fail(str(exc), 2)
        raise
    if sealer is None:
        fail("INBOXCRM_CODEC_KEYS_FILE is not set: nothing to encrypt with", 2)
        raise SystemExit(2)
    tenants = [tenant] if tenant else sorted(load_policies())
    actor = os.environ.get("USER", "operator")

    async def run(conn: asyncpg.Connection[Any]) -> dict[str, Any]:
        report: dict[str, Any] = {"key": sealer.active, "tenants": {}}
        for name in tenants:
            counts: dict[str, Any] = {}
            for column in sealed.COLUMNS:
                resealed = skipped = 0
                from_keys: Counter[str] = Counter()
                cursor: str | None = sealed.COLUMNS[column].start
                while cursor is not None:
                    batch = await sealed.reseal_batch(
                        conn, tenant=name, column=column, sealer=sealer, after=cursor,
                        limit=batch_size, actor=actor)
                    resealed, skipped = resealed + batch.resealed, skipped + batch.skipped
                    from_keys.update(batch.from_keys)
                    cursor = batch.cursor
                    if batch.read:
                        progress(f"{name} {column}: {resealed} re-encrypted")
                counts[column] = {"resealed": resealed, "skipped": skipped,
                                  "from_keys": dict(from_keys)}
            report["tenants"][name] = counts
        return report

    try:
        report = with_db(settings, run)
    except atrest.SealedValueError as exc:  # names key IDs and the column, never data
        fail(f"{exc}; the batches before this one are re-encrypted, run again to resume", 1)
        raise
    if as_json:
        out.print_json(json.dumps(report))
        return
    for name, counts in report["tenants"].items():
        for column, total in counts.items():
            sources = ", ".join(f"{k}: {n}" for k, n in sorted(total["from_keys"].items()))
            out.print(f"{name} {column}: {total['resealed']} re-encrypted under "
                      f"{report['key']}" + (f" (from {sources})" if sources else "")
                      + (f", {total['skipped']} changed meanwhile (left as they are)"
                         if total["skipped"] else ""))
