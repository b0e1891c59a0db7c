"""The codec endpoint for a Temporal UI without single sign-on (standard library only).

    INBOXCRM_CODEC_TOKEN=… python deploy/codec_proxy.py --listen 127.0.0.1:8234 \\
        --relay https://inbox.example.com

The Temporal UI's codec settings are an endpoint, "pass the user access token" (the token of
the person its single sign-on signed in) and "include cross-origin credentials"; there is no
field for a bearer token. So without single sign-on the relay's codec (`POST /codec/decode`,
`/codec/encode`) answers the UI 401, and operators read ciphertext. This proxy forwards the
UI's requests to the relay's codec routes with `Authorization: Bearer $INBOXCRM_CODEC_TOKEN`
added (whatever the browser sent is dropped), and passes the CORS preflight and the relay's
CORS answer through: the relay still decides which origins may read (its
INBOXCRM_CODEC_CORS_ORIGINS) and which namespaces it serves.

Whoever reaches the proxy decodes payloads with the token's authority. Listen where the UI
is and nowhere else: loopback, published on loopback like the UI in Compose, or the same
private network. Give the UI `{proxy}/codec` as its codec endpoint, with "pass the user
access token" off.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("inboxcrm.codec_proxy")

ROUTES = ("/codec/encode", "/codec/decode")
# Request headers the codec contract uses; nothing else goes to the relay.
FORWARDED = ("Content-Type", "X-Namespace", "Origin", "Access-Control-Request-Method",
             "Access-Control-Request-Headers")
# Answer headers the browser needs (the relay's CORS answer among them).
RETURNED = ("Content-Type", "Access-Control-Allow-Origin", "Access-Control-Allow-Methods",
            "Access-Control-Allow-Headers", "Access-Control-Allow-Credentials",
            "Access-Control-Max-Age", "Vary", "WWW-Authenticate")
MAX_BODY = 16 * 1024 * 1024  # above the relay's own limit: the relay answers 413 first
TIMEOUT = 30.0


def make_server(listen: str, relay: str, token: str) -> ThreadingHTTPServer:
    """The proxy on `listen` (host:port) in front of the relay's base URL `relay`."""
    relay = relay.rstrip("/")

    class Handler(BaseHTTPRequestHandler):
        server_version = "inboxcrm-codec-proxy"

        def do_OPTIONS(self) -> None:  # noqa: N802 - the http.server naming
            self._forward(with_body=False)

        def do_POST(self) -> None:  # noqa: N802
            self._forward(with_body=True)

        def _forward(self, with_body: bool) -> None:
            if self.path not in ROUTES:
                self._answer(404, {}, b"")
                return
            if not token:
                self._answer(503, {"Content-Type": "application/json"},
                             b'{"status": "error", "message": "INBOXCRM_CODEC_TOKEN is not set"}')
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._answer(413, {}, b"")
                return
            body = self.rfile.read(length) if with_body else None
            headers = {name: value for name in FORWARDED
                       if (value := self.headers.get(name)) is not None}
            if with_body:
                headers["Authorization"] = f"Bearer {token}"
            request = urllib.request.Request(f"{relay}{self.path}", data=body,
                                             headers=headers, method=self.command)
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                    status, answer, content = response.status, response.headers, response.read()
            except urllib.error.HTTPError as refused:
                status, answer, content = refused.code, refused.headers, refused.read()
            except OSError as exc:
                log.warning("relay unreachable: %s", type(exc).__name__)
                self._answer(502, {}, b"")
                return
            self._answer(status, {name: value for name in RETURNED
                                  if (value := answer.get(name)) is not None}, content)

        def _answer(self, status: int, headers: dict[str, str], content: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            """No access log: paths are fixed and bodies are payloads (personal data)."""

    host, _, port = listen.rpartition(":")
    return ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), Handler)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:8234", help="host:port")
    parser.add_argument("--relay", required=True, help="the relay's base URL")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    token = os.environ.get("INBOXCRM_CODEC_TOKEN", "")
    if not token:
        log.warning("INBOXCRM_CODEC_TOKEN is not set: every codec request answers 503")
    server = make_server(args.listen, args.relay, token)
    log.info("codec proxy on %s for %s/codec", args.listen, args.relay.rstrip("/"))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
