"""The Temporal UI decodes payloads without single sign-on through deploy/codec_proxy.py: the
requests the UI really sends (its data encoder posts `{endpoint}/decode` with Content-Type
and X-Namespace, no Authorization unless "pass the user access token" is on; a CORS
preflight first) reach the relay's real codec routes, which refuse them without the proxy."""

from __future__ import annotations

import base64
import importlib.util
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr

from inboxcrm.ingress.codec import codec_router
from inboxcrm.platform.codec import ensure_key_file
from inboxcrm.platform.config import Settings
from inboxcrm.stack.processes import free_port
from tests.helpers.deploy_files import DEPLOY

UI_ORIGIN = "http://127.0.0.1:8233"
TOKEN = "codec-token-for-the-proxy-test-0123456789"


def proxy_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("codec_proxy", DEPLOY / "codec_proxy.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[str]:
    """The relay's codec routes as a deployment runs them: a non-loopback listener, so a
    credential is required; the UI's origin allowed."""
    keys = tmp_path / "codec-keys.json"
    ensure_key_file(keys)
    settings = Settings(relay_host="0.0.0.0", codec_token=SecretStr(TOKEN),
                        codec_keys_file=str(keys), codec_cors_origins=UI_ORIGIN,
                        temporal_namespace="default")
    app = FastAPI()
    app.include_router(codec_router(settings))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        if server.started:
            break
        threading.Event().wait(0.05)
    yield url
    server.should_exit = True
    thread.join(10)


def start_proxy(relay_url: str, token: str) -> tuple[str, object]:
    server = proxy_module().make_server(f"127.0.0.1:{free_port()}", relay_url, token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return f"http://{host}:{port}", server


def ui_request(endpoint: str, verb: str, payloads: dict[str, object],
               authorization: str | None = None) -> httpx.Response:
    """What the UI's data encoder sends."""
    headers = {"Content-Type": "application/json", "X-Namespace": "default",
               "Origin": UI_ORIGIN}
    if authorization:
        headers["Authorization"] = authorization
    return httpx.post(f"{endpoint}/{verb}", content=json.dumps(payloads), headers=headers,
                      timeout=10)


def plain(value: object) -> dict[str, object]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {"payloads": [{"metadata": {"encoding": b64(b"json/plain")},
                          "data": b64(json.dumps(value).encode())}]}


def test_the_ui_decodes_through_the_proxy_and_not_without_it(relay: str) -> None:
    assert ui_request(f"{relay}/codec", "encode", plain("x")).status_code == 401
    proxy, server = start_proxy(relay, TOKEN)
    try:
        preflight = httpx.options(f"{proxy}/codec/decode", headers={
            "Origin": UI_ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace"}, timeout=10)
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == UI_ORIGIN
        original = plain({"sender": "jane@example.com"})
        encoded = ui_request(f"{proxy}/codec", "encode", original)
        assert encoded.status_code == 200, encoded.text
        assert encoded.json() != original  # encrypted
        decoded = ui_request(f"{proxy}/codec", "decode", encoded.json(),
                             authorization="Bearer whatever-the-browser-had")
        assert decoded.status_code == 200, decoded.text
        assert decoded.headers["access-control-allow-origin"] == UI_ORIGIN
        [payload] = decoded.json()["payloads"]
        assert json.loads(base64.b64decode(payload["data"])) == {"sender": "jane@example.com"}
        # Only the codec routes are forwarded.
        assert httpx.post(f"{proxy}/review/", timeout=10).status_code == 404
    finally:
        server.shutdown()  # type: ignore[attr-defined]


def test_a_proxy_without_a_token_says_so(relay: str) -> None:
    proxy, server = start_proxy(relay, "")
    try:
        answer = ui_request(f"{proxy}/codec", "decode", plain("x"))
        assert answer.status_code == 503 and "INBOXCRM_CODEC_TOKEN" in answer.text
    finally:
        server.shutdown()  # type: ignore[attr-defined]
