"""Bounded CPU work off the event loop: a small pool of long-lived child processes with a
hard wall-clock limit per call that kills the child (docs/architecture.md §7).

Everything in an inbound message is attacker-controlled, and parsing it is CPU work. Run
on the worker's (or the relay's) event loop, one slow message stops every workflow task,
heartbeat and HTTP request of that process; run in a thread it cannot be stopped. Here it
runs in a child process: the caller awaits the answer, the loop keeps turning, and a call
that overruns `time_limit` gets its child SIGKILLed and replaced, and raises
`BudgetExceeded`. A child that dies mid-call (a crash, the memory limit) raises the same.

Why our own children (`python -m inboxcrm.platform.work_child`, framed pickles to the
child and data-only JSON back, over stdin/stdout: the child reads untrusted mail, so the
parent never unpickles what it writes) rather than `multiprocessing`: its `spawn` /
`forkserver` children re-run the parent's `__main__` module (the whole worker or relay)
before their first job; a fresh interpreter imports only `preload`. `fork` is unsafe in a
process that runs Temporal's core threads. A child starts in ~0.3 s (imports), once, and
again only after a kill; a call costs two pipe writes, a small pickle and a small JSON
answer (`bench/extraction_budget.py` measures it).

Fair across tenants: a caller names the tenant its work is for (`for_tenant`), every
tenant waits in a queue of its own, and a free child goes to the tenants in turn. Anyone
can send mail to any tenant, so a sender whose messages each cost a child its time limit
delays that tenant's queue only: another tenant's message waits for at most the calls
already running, never for the queue in front of it.

`InProcess` offers the same `run` for the CLI and tests: the parse limits of the code it
runs still apply, but nothing can be killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import struct
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

from inboxcrm.platform.work_child import NotData, read_result

P = ParamSpec("P")
T = TypeVar("T")
BudgetReason = Literal["time", "crashed", "memory", "recursion"]
HEADER = struct.Struct(">I")
CHILD_MODULE = "inboxcrm.platform.work_child"
SHARED = ""  # the queue of calls that name no tenant
log = logging.getLogger("inboxcrm.workpool")


class BudgetExceeded(Exception):
    """The call did not finish within its work budget: `reason` is `time` (the child was
    killed at the limit), `crashed` (the child died), `memory` or `recursion` (the child
    hit its memory limit or Python's recursion limit). Never carries the input."""

    def __init__(self, reason: BudgetReason, seconds: float) -> None:
        super().__init__(f"work budget exceeded: {reason} after {seconds:.2f} s")
        self.reason: BudgetReason = reason
        self.seconds = seconds


class WorkFailed(Exception):
    """The function raised in the child; only the exception's type name crosses over."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"work failed: {kind}")
        self.kind = kind


class WorkPoolUnavailable(Exception):
    """No child process could run the call (the pool is closed, or children cannot start):
    a property of this process, not of the input, so the caller retries."""


class Runner(Protocol):
    """Runs a module-level function and its (picklable) arguments; `WorkPool` in a child
    under a time limit, `InProcess` directly. `for_tenant(t).run(...)` queues the call as
    tenant `t`'s work (the pool serves tenants in turn)."""

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...

    def for_tenant(self, tenant: str) -> Runner: ...


class InProcess:
    """`Runner` in this process: for the CLI and tests (no kill, same code)."""

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return fn(*args, **kwargs)

    def for_tenant(self, tenant: str) -> InProcess:
        return self


IN_PROCESS = InProcess()


@dataclass
class PoolStats:
    calls: int = 0
    killed: int = 0  # at the time limit
    crashed: int = 0  # died mid-call, or hit the memory / recursion limit
    started: int = 0  # children started, the first ones included


@dataclass(eq=False)
class _Child:
    process: asyncio.subprocess.Process
    calls: int = field(default=0)


class TenantRunner:
    """A `WorkPool` whose calls wait in one tenant's queue."""

    def __init__(self, pool: WorkPool, tenant: str) -> None:
        self.pool = pool
        self.tenant = tenant

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.pool.run_for(self.tenant, fn, *args, **kwargs)

    def for_tenant(self, tenant: str) -> TenantRunner:
        return self.pool.for_tenant(tenant)


class WorkPool:
    """`processes` children, each running one call at a time. A call waits in its tenant's
    queue (first come, first served within it); a free child goes to the tenant with a call
    waiting that was served least recently. Start with `await start()`, stop with
    `await close()`."""

    def __init__(self, *, processes: int, time_limit: float, memory_limit_mb: int | None = None,
                 preload: Sequence[str] = (), warmup: Callable[[], object] | None = None,
                 start_timeout: float = 60.0) -> None:
        if processes < 1:
            raise ValueError("a work pool needs at least one process")
        if time_limit <= 0:
            raise ValueError("the time limit must be positive")
        self.processes = processes
        self.time_limit = time_limit
        self._config = pickle.dumps({
            "sys_path": list(sys.path),
            "preload": list(preload),
            "warmup": warmup,
            "memory_bytes": memory_limit_mb * 1024 * 1024 if memory_limit_mb else None,
        }, protocol=pickle.HIGHEST_PROTOCOL)
        self._start_timeout = start_timeout
        self._idle: list[_Child] = []  # free children (only while no call waits)
        # the calls waiting for a child, per tenant; a free child goes to the tenant served
        # least recently (`_served`: the serial number of its last call), so one that just
        # had a turn waits behind every other tenant with a call waiting, newcomers too
        self._waiting: dict[str, deque[asyncio.Future[_Child]]] = {}
        self._served: dict[str, int] = {}
        self._serial = 0
        self._children: set[_Child] = set()
        self._replacing: set[asyncio.Task[None]] = set()
        self._closed = False
        self.stats = PoolStats()

    async def start(self) -> None:
        """Start every child and wait until each has imported what it needs."""
        children = await asyncio.gather(*(self._spawn() for _ in range(self.processes)),
                                        return_exceptions=True)
        failures = [c for c in children if isinstance(c, BaseException)]
        for child in children:
            if isinstance(child, _Child):
                self._release(child)
        if failures:
            await self.close()
            raise WorkPoolUnavailable("work pool children could not start") from failures[0]

    async def __aenter__(self) -> WorkPool:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def for_tenant(self, tenant: str) -> TenantRunner:
        """This pool as a `Runner` whose calls are `tenant`'s work."""
        return TenantRunner(self, tenant)

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` in a child, within `time_limit` seconds of wall clock (in
        the queue of calls that name no tenant)."""
        return await self.run_for(SHARED, fn, *args, **kwargs)

    async def run_for(self, tenant: str, fn: Callable[P, T], /, *args: P.args,
                      **kwargs: P.kwargs) -> T:
        """`run`, waiting for a child in `tenant`'s queue."""
        job = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        self.stats.calls += 1
        for _ in range(3):
            child = await self._acquire(tenant)
            loop = asyncio.get_running_loop()
            started = loop.time()
            healthy = False
            try:
                try:
                    await self._send(child, job)
                except (ConnectionError, OSError):
                    continue  # it died while idle: not this input's doing; another child
                try:
                    async with asyncio.timeout(self.time_limit):
                        status, value = await self._receive(child)
                except TimeoutError:
                    self.stats.killed += 1
                    raise BudgetExceeded("time", loop.time() - started) from None
                except (EOFError, ConnectionError, OSError):
                    self.stats.crashed += 1
                    raise BudgetExceeded("crashed", loop.time() - started) from None
                child.calls += 1
                if status == "ok":
                    healthy = True
                    return value  # type: ignore[no-any-return]
                if status == "error":
                    healthy = True
                    raise WorkFailed(str(value))
                self.stats.crashed += 1
                reason: BudgetReason = "memory" if status == "memory" else "recursion"
                raise BudgetExceeded(reason, loop.time() - started)
            finally:
                # a child that did not answer cleanly (timeout, death, cancellation of the
                # caller mid-call, a memory error) is never reused
                if healthy and not self._closed:
                    self._release(child)
                else:
                    self._retire(child)
        raise WorkPoolUnavailable("work pool children keep dying before a call")

    def child_pids(self) -> list[int]:
        """The PIDs of the children now running (for metrics and benchmarks)."""
        return [child.process.pid for child in self._children
                if child.process.returncode is None]

    async def close(self) -> None:
        """Stop every child: idle ones see end of input and exit, busy ones are killed."""
        self._closed = True
        for task in list(self._replacing):
            task.cancel()
        for task in list(self._replacing):
            with contextlib.suppress(BaseException):
                await task
        for child in self._idle:
            stdin = child.process.stdin
            if stdin is not None:
                with contextlib.suppress(Exception):
                    stdin.close()
        self._idle.clear()
        for queue in self._waiting.values():  # every caller still waiting for a child
            for waiter in queue:
                if not waiter.done():
                    waiter.set_exception(WorkPoolUnavailable("work pool closed"))
        self._waiting.clear()
        for child in list(self._children):
            with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                await asyncio.wait_for(child.process.wait(), 2.0)
            self._kill(child)
            with contextlib.suppress(Exception):
                await child.process.wait()
            self._children.discard(child)

    # ------------------------------------------------------------------ children

    async def _acquire(self, tenant: str) -> _Child:
        while True:
            if self._closed:
                raise WorkPoolUnavailable("work pool closed")
            waiter: asyncio.Future[_Child] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, deque()).append(waiter)
            if self._idle:  # to whoever's turn it is (this call, when no one else waits)
                self._release(self._idle.pop())
            try:
                child = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._release(waiter.result())  # handed over as the caller left
                raise
            if child.process.returncode is None:
                return child
            self._retire(child)

    def _release(self, child: _Child) -> None:
        """`child` is free: to the first waiting call of the tenant served least recently
        (in order of arrival among those never served), else idle."""
        while self._waiting:
            tenant = min(self._waiting, key=lambda name: self._served.get(name, 0))
            queue = self._waiting[tenant]
            waiter = None
            while queue:
                candidate = queue.popleft()
                if not candidate.done():  # a cancelled caller has left its queue
                    waiter = candidate
                    break
            if not queue:
                del self._waiting[tenant]
            if waiter is not None:
                self._serial += 1
                self._served[tenant] = self._serial
                waiter.set_result(child)
                return
        self._idle.append(child)

    async def _spawn(self) -> _Child:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", CHILD_MODULE,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        child = _Child(process)
        self._children.add(child)
        self.stats.started += 1
        try:
            await self._send(child, self._config)
            status, _ = await asyncio.wait_for(self._receive(child), self._start_timeout)
            if status != "ready":
                raise WorkPoolUnavailable("work pool child did not start")
        except BaseException:
            self._kill(child)
            with contextlib.suppress(Exception):
                await process.wait()
            self._children.discard(child)
            raise
        return child

    def _retire(self, child: _Child) -> None:
        """Kill `child` and start its replacement in the background."""
        self._kill(child)
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._replace(child))
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _replace(self, old: _Child) -> None:
        with contextlib.suppress(Exception):
            await old.process.wait()
        self._children.discard(old)
        delay = 0.5
        while not self._closed:
            try:
                child = await self._spawn()
            except Exception:
                log.warning("work pool: a replacement child could not start; retrying")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if self._closed:
                self._kill(child)
                return
            self._release(child)
            return

    @staticmethod
    def _kill(child: _Child) -> None:
        if child.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()

    @staticmethod
    async def _send(child: _Child, data: bytes) -> None:
        stdin = child.process.stdin
        if stdin is None:
            raise ConnectionError("no stdin")
        stdin.write(HEADER.pack(len(data)) + data)
        await stdin.drain()

    @staticmethod
    async def _receive(child: _Child) -> tuple[str, Any]:
        stdout = child.process.stdout
        if stdout is None:
            raise ConnectionError("no stdout")
        (size,) = HEADER.unpack(await stdout.readexactly(HEADER.size))
        try:
            return read_result(await stdout.readexactly(size))
        except NotData:
            # Not what a child of ours writes: it is not trusted again (killed, replaced).
            log.warning("work pool: a child answered outside the data-only format")
            raise ConnectionError("work child answered outside its format") from None
