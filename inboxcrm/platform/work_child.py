"""One child of a `WorkPool` (`inboxcrm/platform/workpool.py`): a fresh interpreter that
imports what its jobs need once, then runs one job at a time for as long as the parent
keeps it (docs/architecture.md §7).

Protocol, over stdin / stdout: frames of a 4-byte big-endian length and a body. Parent to
child, a pickle (the parent is trusted): the first frame is the configuration
(`sys.path`, modules to import, a warm-up function, the memory limit), then each frame is a
job `(function, args, kwargs)`. Child to parent, data only: JSON in the tagged format of
`encode_result` (dataclasses and pydantic models of `inboxcrm` modules the parent has
loaded, enums, tuples, bytes, ... rebuilt field by field, never by running code a frame
names), so a child compromised by the mail it reads cannot make the parent unpickle
anything. The child answers `["ready", pid]`, then each job with `["ok", result]`,
`["memory" | "recursion", null]` or `["error", exception type name]`: never the
exception's text, which may quote the input. End of input: the child exits. The parent
kills a child that overruns its time.

Anything a library prints goes to stderr: stdout carries only frames.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import datetime
import enum
import importlib
import json
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


def write_frame(stream: IO[bytes], status: str, value: object) -> None:
    """An answer to the parent: `[status, value]`, the value as `encode_result` has it."""
    data = json.dumps([status, encode_result(value)], separators=(",", ":")).encode()
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


class NotData(TypeError):
    """A value the child→parent format does not carry, or a frame that is not in it."""


# Only classes of the product cross, and only ones the parent has already imported.
_OURS = "inboxcrm."


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def encode_result(value: Any) -> Any:
    """A value as tagged JSON: scalars as themselves, anything else as a one-key object
    (`l` list, `t` tuple, `d` dict as pairs, `s`/`fs` set/frozenset, `b` bytes, `dt`/`date`,
    `e` enum, `dc` dataclass, `pm` pydantic model). Raises NotData for anything else."""
    if isinstance(value, enum.Enum):  # before str and int: a StrEnum is both
        return {"e": _name(type(value)), "v": encode_result(value.value)}
    if value is None or isinstance(value, bool | str | int | float):
        return value
    if isinstance(value, bytes | bytearray):
        return {"b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, list):
        return {"l": [encode_result(v) for v in value]}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return {"t": [encode_result(v) for v in value]}
    if isinstance(value, dict):
        return {"d": [[encode_result(k), encode_result(v)] for k, v in value.items()]}
    if isinstance(value, frozenset):
        return {"fs": [encode_result(v) for v in value]}
    if isinstance(value, set):
        return {"s": [encode_result(v) for v in value]}
    if isinstance(value, datetime.datetime):
        return {"dt": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"date": value.isoformat()}
    cls = type(value)
    if cls.__module__.startswith(_OURS) and dataclasses.is_dataclass(value):
        return {"dc": _name(cls), "f": {f.name: encode_result(getattr(value, f.name))
                                        for f in dataclasses.fields(value)}}
    fields = getattr(cls, "model_fields", None)
    if cls.__module__.startswith(_OURS) and isinstance(fields, dict):
        return {"pm": _name(cls), "f": {name: encode_result(getattr(value, name))
                                        for name in fields}}
    raise NotData(f"{cls.__name__} does not cross from a work child")


def _class(name: Any) -> type:
    """A class of the product the parent has loaded (no import, nothing run)."""
    module_name, _, qualname = str(name).partition(":")
    module = sys.modules.get(module_name) if module_name.startswith(_OURS) else None
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None) if found is not None else None
    if not isinstance(found, type) or found.__module__ != module_name:
        raise NotData("a class the parent does not know")
    return found


def decode_result(data: Any) -> Any:
    """The value `encode_result` made. Raises NotData for anything else."""
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if isinstance(data, list):
        raise NotData("an untagged list")
    if not isinstance(data, dict) or not data:
        raise NotData("not a tagged value")
    tag = next(iter(data))
    body = data[tag]
    if tag == "l":
        return [decode_result(v) for v in body]
    if tag == "t":
        return tuple(decode_result(v) for v in body)
    if tag == "d":
        return {decode_result(k): decode_result(v) for k, v in body}
    if tag == "fs":
        return frozenset(decode_result(v) for v in body)
    if tag == "s":
        return {decode_result(v) for v in body}
    if tag == "b":
        return base64.b64decode(body, validate=True)
    if tag == "dt":
        return datetime.datetime.fromisoformat(body)
    if tag == "date":
        return datetime.date.fromisoformat(body)
    if tag in ("e", "dc", "pm"):
        cls = _class(body)
        if tag == "e":
            if not issubclass(cls, enum.Enum):
                raise NotData("not an enum")
            return cls(decode_result(data["v"]))
        values = {str(k): decode_result(v) for k, v in dict(data["f"]).items()}
        if tag == "pm":
            fields = getattr(cls, "model_fields", None)
            if not isinstance(fields, dict) or set(values) - set(fields):
                raise NotData("not a model of these fields")
            return cls.model_construct(**values)  # type: ignore[attr-defined]
        if not dataclasses.is_dataclass(cls) or set(values) != {
                f.name for f in dataclasses.fields(cls)}:
            raise NotData("not a dataclass of these fields")
        built = object.__new__(cls)
        for name, value in values.items():
            object.__setattr__(built, name, value)  # frozen ones too; no code runs
        return built
    raise NotData(f"unknown tag {tag[:20]!r}")


def read_result(data: bytes) -> tuple[str, Any]:
    """A child's answer frame: (status, value). Raises NotData for anything but the JSON
    this module writes (a pickle included)."""
    try:
        frame = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise NotData("not JSON") from None
    if not isinstance(frame, list) or len(frame) != 2 or not isinstance(frame[0], str):
        raise NotData("not an answer")
    try:
        return frame[0], decode_result(frame[1])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise NotData(type(exc).__name__) from None


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
        write_frame(out, "ready", os.getpid())
        while True:
            job = read_frame(inp)
            status, value = _run(job)
            try:
                write_frame(out, status, value)
            except (TypeError, ValueError, AttributeError, RecursionError):
                write_frame(out, "error", "UnserialisableResult")
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


if __name__ == "__main__":
    main()
