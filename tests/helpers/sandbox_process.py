"""A real sandbox process (`python -m sandbox`) on loopback, for tests that need one of their
own (API key, short timings)."""


from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

API_KEY = "test-sandbox-key"
SEARCH_LAG = 1.0
HANG = 1.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SandboxProcess:
    """Start/stop `python -m sandbox` as a subprocess, keeping its stderr for diagnosis.

    `tls` = (certificate, key): serve https (the certificate is its own CA)."""

    def __init__(self, database_url: str, port: int, *, args: tuple[str, ...] = (),
                 tls: tuple[Path, Path] | None = None) -> None:
        self.database_url = database_url
        self.port = port
        self.args = args
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.log = Path(tempfile.mkstemp(prefix="sandbox-", suffix=".log")[1])
        self.proc: asyncio.subprocess.Process | None = None

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "SANDBOX_API_KEY": API_KEY,
            "SANDBOX_SEARCH_LAG_SECONDS": str(SEARCH_LAG),
            "SANDBOX_HANG_SECONDS": str(HANG),
        }

    async def start(self) -> None:
        tls_args = (["--ssl-certfile", str(self.tls[0]), "--ssl-keyfile", str(self.tls[1])]
                    if self.tls else [])
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "inboxcrm.sandbox",
                "--port",
                str(self.port),
                *tls_args,
                *self.args,
                env=self.env(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(self.tls[0]))
                                         if self.tls else True)
        async with httpx.AsyncClient(base_url=self.url, timeout=1.0, verify=verify) as client:
            for _ in range(200):
                if self.proc.returncode is not None:
                    break
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"sandbox did not start:\n{self.log.read_text()[-3000:]}")

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def running(process: SandboxProcess) -> AsyncIterator[SandboxProcess]:
    """Start `process` for a fixture, stop it after, and fail if it logged a traceback."""
    await process.start()
    yield process
    await process.stop()
    log = process.log.read_text()
    process.log.unlink(missing_ok=True)
    assert "Traceback" not in log, f"sandbox raised during the tests:\n{log[-5000:]}"


async def own_sandbox(server_url: str, name: str) -> AsyncIterator[SandboxProcess]:
    """A sandbox with a database of its own (an account nobody else writes to), for a
    module's fixture: started, stopped and its database dropped after."""
    from inboxcrm.stack import postgres

    url = await postgres.create_database(server_url, name)
    try:
        async for process in running(SandboxProcess(url, free_port())):
            yield process
    finally:
        await postgres.drop_database(server_url, url)
