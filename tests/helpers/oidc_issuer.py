"""A local OIDC issuer for tests (an OIDC issuer cannot exist here): an RSA key made in the
test, its discovery document and JWKS served over loopback HTTP, and access tokens minted as
the organisation's identity provider would (PyJWT, RS256)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

AUDIENCE = "inboxcrm-review"
TENANTS_CLAIM = "inboxcrm_tenants"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class LocalIssuer:
    url: str
    key: rsa.RSAPrivateKey
    kid: str = "test-key-1"
    fetches: list[str] = field(default_factory=list)

    def jwks(self) -> dict[str, Any]:
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        return {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def token(self, *, key: rsa.RSAPrivateKey | None = None, audience: str | list[str] = AUDIENCE,
              expires_in: float = 300, tenants: list[str] | None = None,
              email: str = "dana@example.test", issuer: str | None = None,
              kid: str | None = None, typ: str = "JWT", **claims: Any) -> str:
        now = int(time.time())
        payload: dict[str, Any] = {"iss": issuer or self.url, "aud": audience, "sub": "u-1",
                                   "email": email, "email_verified": True, "iat": now,
                                   "exp": now + int(expires_in)}
        if tenants is not None:
            payload[TENANTS_CLAIM] = tenants
        payload.update(claims)
        return jwt.encode(payload, key or self.key, algorithm="RS256",
                          headers={"kid": kid or self.kid, "typ": typ})


@contextmanager
def serve_issuer() -> Iterator[LocalIssuer]:
    """The issuer on a free loopback port, for the duration of the block."""
    issuer: LocalIssuer | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            assert issuer is not None
            issuer.fetches.append(self.path)
            if self.path == "/.well-known/openid-configuration":
                body: dict[str, Any] = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks",
                                        "id_token_signing_alg_values_supported": ["RS256"]}
            elif self.path == "/jwks":
                body = issuer.jwks()
            else:
                self.send_response(404)
                self.end_headers()
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    issuer = LocalIssuer(f"http://127.0.0.1:{server.server_address[1]}", rsa_key())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield issuer
    finally:
        server.shutdown()
        server.server_close()
