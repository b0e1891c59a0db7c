"""One child of a `WorkPool` (`inboxcrm/platform/workpool.py`): a fresh interpreter that
imports what its jobs need once, then runs one job at a time for as long as the parent
keeps it (docs/architecture.md §7).

Protocol, over stdin / stdout: frames of a 4-byte big-endian length and a pickle. The
first frame is the configuration (`sys.path`, modules to import, a warm-up function, the
memory limit); the child answers `("ready", pid)`. Then each frame is a job
`(function, args, kwargs)`, answered by `("ok", result)`, `("memory" | "recursion", None)`
or `("error", exception type name)`: never the exception's text, which may quote the
input. End of input: the child exits. The parent kills a child that overruns its time.

Anything a library prints goes to stderr: stdout carries only frames.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import pickle
import resource
import signal
import struct
import sys
from typing import IO, Any

HEADER = struct.Struct(">I")
PR_SET_PDEATHSIG = 1


def read_frame(stream: IO[bytes]) -> bytes:
    """The next frame's pickle, or raise EOFError."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        raise EOFError
    (size,) = HEADER.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return data


def write_frame(stream: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def _die_with_parent() -> None:
    """Linux: SIGKILL when the parent dies (a worker killed -9 leaves no child computing),
    and the first victim of the OOM killer in a container at its memory limit, before the
    worker or relay that runs it (its call is then `crashed`: too_complex)."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("1000")


def _configure(config: dict[str, Any]) -> None:
    sys.path[:] = list(config.get("sys_path") or sys.path)
    memory = config.get("memory_bytes")
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
    for name in config.get("preload") or ():
        importlib.import_module(name)
    warmup = config.get("warmup")
    if warmup is not None:
        with contextlib.suppress(Exception):
            warmup()


def _run(job: bytes) -> tuple[str, object]:
    try:
        fn, args, kwargs = pickle.loads(job)
        return "ok", fn(*args, **kwargs)
    except MemoryError:
        return "memory", None
    except RecursionError:
        return "recursion", None
    except Exception as exc:  # only the type crosses: the text may quote the input
        return "error", type(exc).__name__


def main() -> None:
    # Ctrl-C reaches the whole process group: the parent closes its children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print() can never corrupt a frame
    sys.stdout = sys.stderr
    try:
        _configure(pickle.loads(read_frame(inp)))
        write_frame(out, ("ready", os.getpid()))
        while True:
            job = read_frame(inp)
            status, value = _run(job)
            try:
                write_frame(out, (status, value))
            except (pickle.PicklingError, TypeError, AttributeError):
                write_frame(out, ("error", "UnpicklableResult"))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


if __name__ == "__main__":
    main()
