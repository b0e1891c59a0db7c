"""The ingress baseline: a FastAPI app under uvicorn (one process, like the relay) whose only
work is to read the body and verify the Standard Webhooks signature, then answer a JSON
object of the relay's shape. No database, no Temporal.

    INBOXCRM_WEBHOOK_SECRET=whsec_... python -m bench.bare_endpoint --port 8099
"""

from __future__ import annotations

import argparse
import binascii

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from inboxcrm.platform.config import Settings


def create_app(secret: str) -> FastAPI:
    webhook = Webhook(secret)
    app = FastAPI(title="bench bare endpoint")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.post("/v1/inbound/standard")
    async def inbound_standard(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            webhook.verify(body, dict(request.headers), json_parse=False)
        except (WebhookVerificationError, UnicodeDecodeError, ValueError, binascii.Error):
            return JSONResponse({"status": "error", "message": "invalid signature"},
                                status_code=401)
        return JSONResponse({"status": "duplicate", "workflow_id": "bare", "state": "bare"})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    uvicorn.run(create_app(Settings().webhook_secret), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
