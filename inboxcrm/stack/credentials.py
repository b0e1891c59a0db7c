"""Inbound credentials for the local stack: generated once per data directory."""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path

CREDENTIALS_FILE = "inbound-credentials.json"


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and the base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


_GENERATORS: dict[str, Callable[[], str]] = {
    "INBOXCRM_POSTMARK_USER": lambda: f"postmark-{secrets.token_hex(4)}",
    "INBOXCRM_POSTMARK_PASSWORD": lambda: secrets.token_urlsafe(32),
    "INBOXCRM_MAILGUN_SIGNING_KEY": lambda: secrets.token_hex(32),
    "INBOXCRM_UNSUBSCRIBE_SECRET": lambda: secrets.token_urlsafe(32),
    "INBOXCRM_REVIEW_TOKEN": lambda: secrets.token_urlsafe(32),
    # The demo tenant globex's own Standard Webhooks secret (bound to globex only).
    "INBOXCRM_WEBHOOK_SECRET_GLOBEX": new_webhook_secret,
    # Proves desk and CLI decisions to the worker; keys the desk's sessions.
    "INBOXCRM_DECISION_SECRET": lambda: secrets.token_urlsafe(32),
}



def generated_credentials(data_dir: Path) -> dict[str, str]:
    """Postmark basic-auth pair, Mailgun signing key, unsubscribe secret, review token and
    globex's own webhook secret and the decision secret for the local stack: from the
    environment, else generated once per data directory (mode 0600 file in .data/, never
    in the repository)."""
    path = data_dir / CREDENTIALS_FILE
    stored: dict[str, str] = {}
    try:
        loaded = json.loads(path.read_text())
        if isinstance(loaded, dict):
            stored = {k: v for k, v in loaded.items() if isinstance(v, str) and v}
    except (OSError, ValueError):
        stored = {}
    if any(name not in stored for name in _GENERATORS):
        stored = {name: stored.get(name) or make() for name, make in _GENERATORS.items()}
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(stored, handle, indent=2)
        try:
            os.link(tmp, path)  # first writer wins; a concurrent starter reads its values
        except FileExistsError:
            try:
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict) and all(
                        isinstance(loaded.get(n), str) for n in _GENERATORS):
                    stored = loaded
                else:
                    os.replace(tmp, path)
            except (OSError, ValueError):
                os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
    return {name: os.environ.get(name) or stored[name] for name in _GENERATORS}

