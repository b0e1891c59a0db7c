"""Module-level functions a `WorkPool` child can run (a job is pickled by reference)."""

from __future__ import annotations

import os
import time


def square(value: int) -> int:
    return value * value


def spin(seconds: float) -> str:
    """Busy CPU, as a runaway parse is (no sleep a signal could cut short)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "finished"


def die() -> None:
    os._exit(3)


def raise_with_secret() -> None:
    raise ValueError("jane.doe@example.com wrote something private")


def allocate(megabytes: int) -> int:
    return len(bytearray(megabytes * 1024 * 1024))


def recurse(depth: int = 0) -> int:
    return recurse(depth + 1)


def pid_after(seconds: float) -> int:
    """Holds its child for a while: concurrent calls then land on different children."""
    time.sleep(seconds)
    return os.getpid()
