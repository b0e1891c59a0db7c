"""A budget of calls per second that never waits: for work that is worth doing only when it
is cheap to do now (shadow mode's second opinion from a model), never for work an item
needs."""

from __future__ import annotations

import time
from collections.abc import Callable


class CallBudget:
    """A token bucket: `per_second` calls on average, at most `burst` at once (default: one
    second's worth, at least one). `take()` answers at once: True spends a call, False means
    the budget is spent for now. One per process; not shared between processes."""

    def __init__(self, per_second: float, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = max(per_second, 0.0)
        default = max(1.0, self._rate) if self._rate > 0 else 0.0
        self._capacity = default if burst is None else max(burst, 0.0)
        self._tokens = self._capacity
        self._clock = clock
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False
