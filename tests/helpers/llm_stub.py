"""A small OpenAI-compatible chat-completions server for tests: a FastAPI app served by
uvicorn on a free loopback port in a background thread. It answers from a script of
actions (valid JSON, schema-violating JSON, injected answers, slow answers, 429/5xx/401)
and records every request so tests can inspect what the extractor sent."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import deque
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def completion(content: str | None, model: str, finish_reason: str = "stop",
               refusal: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": refusal},
            "finish_reason": finish_reason,
            "logprobs": None,
        }],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def content(text: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "content", "content": text, **extra}


def status(code: int, retry_after: str | None = None, **extra: Any) -> dict[str, Any]:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return {"kind": "status", "status": code, "headers": headers, **extra}


def create_app(state: StubState) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        state.requests.append({"body": body, "headers": dict(request.headers)})
        try:
            action = state.actions.popleft()
        except IndexError:
            action = status(503, message="no scripted answer left")
        delay = float(action.get("delay", 0))
        if delay:
            await asyncio.sleep(delay)
        kind = action["kind"]
        if kind == "content":
            return JSONResponse(completion(
                action["content"], body.get("model", "stub"),
                action.get("finish_reason", "stop"), action.get("refusal"),
            ))
        if kind == "status":
            code = int(action["status"])
            return JSONResponse(
                {"error": {"message": action.get("message", "scripted error"),
                           "type": "scripted", "code": str(code)}},
                status_code=code, headers=action.get("headers") or {},
            )
        if kind == "garbage":
            return Response(b"{not json", media_type="application/json")
        raise AssertionError(f"unknown scripted action {kind!r}")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}

    return app


class StubState:
    def __init__(self) -> None:
        self.actions: deque[dict[str, Any]] = deque()
        self.requests: list[dict[str, Any]] = []


class StubServer:
    def __init__(self) -> None:
        self.state = StubState()
        self.port = free_port()
        config = uvicorn.Config(
            create_app(self.state), host="127.0.0.1", port=self.port, log_level="warning",
            lifespan="off", timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="llm-stub", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> StubServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("LLM stub server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)

    def script(self, *actions: dict[str, Any]) -> None:
        self.state.actions.clear()
        self.state.requests.clear()
        self.state.actions.extend(actions)

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.state.requests
