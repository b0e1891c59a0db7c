"""The `extract` group: offline extraction of one message (`extract`, printed here; the
domain returns data) and one signed test delivery to the running relay (`send-test`)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Annotated

import httpx
import typer

from inboxcrm.cli.common import JsonOpt, fail, out, settings_from_env
from inboxcrm.domain.extraction import (
    Extractor,
    OfflineExtractError,
    extract_offline,
    summary,
)
from inboxcrm.schemas.sources import SOURCE_NAMES


def extract(
    file: Annotated[Path, typer.Argument(help="An RFC 5322 message (.eml).")],
    tenant: Annotated[str, typer.Option(help="Tenant whose policy applies.")] = "acme",
    as_json: JsonOpt = False,
    source: Annotated[str, typer.Option(
        help=f"The inbound source the message came through ({', '.join(SOURCE_NAMES)}, "
             "smtp): which provider verdicts on the sender are trusted.")] = "standard",
) -> None:
    """Offline extraction + validation + routing. Writes nothing."""
    raise typer.Exit(run_extract_command(file, tenant, as_json, source=source))


def send_test(
    sender: Annotated[str, typer.Option("--from")] = "Jane Doe <jane.doe@example.com>",
    delivery_id: Annotated[str | None, typer.Option()] = None,
    eml: Annotated[Path | None, typer.Option(help="Send this .eml instead of a sample.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Post one signed inbound email to the running relay (a first end-to-end check). Exit 1
    when the relay does not accept it."""
    from inboxcrm.verify.signing import sample_message, signed_headers, standard_body

    settings = settings_from_env()
    if not settings.webhook_secret:
        fail("no webhook secret: run next to a stack started with `make up` (it writes "
             ".data/stack.env), or set INBOXCRM_WEBHOOK_SECRET")
    if eml is not None:
        try:
            raw = eml.read_text(errors="replace")
        except OSError as exc:
            fail(f"cannot read {eml}: {exc.strerror}")
            return
    else:
        raw = sample_message(sender)
    body = standard_body("acme", "sales@acme.test", delivery_id or f"test-{uuid.uuid4().hex[:12]}",
                         raw)
    relay = os.environ.get("RELAY_URL", f"http://{settings.relay_host}:{settings.relay_port}")
    try:
        headers = signed_headers(settings.webhook_secret, body)
    except Exception as exc:  # noqa: BLE001 - a malformed secret; never print its value
        fail(f"INBOXCRM_WEBHOOK_SECRET is not a Standard Webhooks secret (whsec_<base64>): "
             f"{type(exc).__name__}")
        return
    try:
        response = httpx.post(f"{relay}/v1/inbound/standard", content=body, headers=headers,
                              timeout=30)
    except httpx.HTTPError as exc:
        fail(f"relay not reachable at {relay} ({type(exc).__name__}); is `make up` running?")
        return
    try:
        answer = response.json()
    except ValueError:
        answer = {"body": response.text[:500]}
    if as_json:
        out.print_json(json.dumps(answer))
    else:
        out.print(f"HTTP {response.status_code}")
        out.print_json(json.dumps(answer))
    if response.status_code != 200:
        detail = answer.get("detail") if isinstance(answer, dict) else None
        fail(f"the relay answered HTTP {response.status_code}"
             + (f": {detail}" if isinstance(detail, str) else ""))


def run_extract_command(
    path: Path, tenant: str, as_json: bool, extractor: Extractor | None = None,
    source: str = "standard",
) -> int:
    """`inboxcrm extract FILE.eml [--tenant T] [--json]`: exit 0 for any content (garbage
    included); 1 if the file cannot be read or the tenant is unknown."""
    try:
        result = extract_offline(path, tenant, extractor, source)
    except OfflineExtractError as exc:
        print(f"inboxcrm extract: {exc}", file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(f"inboxcrm extract: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps(result.outcome.section10_json(), ensure_ascii=False))
    else:
        print(summary(result.outcome))
    return 0
