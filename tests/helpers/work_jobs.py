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


def answer_with_a_pickle(marker: str) -> None:
    """What a child compromised by the mail it reads could do: write its own answer frame
    to the parent, a pickle that would touch `marker` when loaded."""
    import gc
    import io
    import pathlib
    import pickle
    import struct

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return pathlib.Path.touch, (marker,)  # type: ignore[return-value]

    [frames] = [o for o in gc.get_objects() if isinstance(o, io.BufferedWriter)
                and not o.closed and o.fileno() > 2 and o.mode == "wb"]
    data = pickle.dumps(("ok", (Payload(),)))
    frames.write(struct.pack(">I", len(data)) + data)
    frames.flush()


def product_values() -> object:
    """Values of the product's own types, as extraction and the card return them."""
    from inboxcrm.domain.extraction.authentication import Authentication
    from inboxcrm.schemas.models import ItemState, OpenReview

    return {"review": OpenReview(reason="r", owner="o", since="s", allowed=["hold"],
                                 op_key=None, wait_id="w1-review"),
            "state": ItemState.HELD, "raw": b"\x00\xff", "pair": (1, "a"),
            "set": frozenset({"x"}), "auth": Authentication.__name__}
