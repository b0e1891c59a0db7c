"""Per-tenant intake rates at the relay (docs/capacity.md, "Fair across tenants").

Anyone can send mail to any tenant, so one tenant's burst (a newsletter storm, a loop) would
otherwise take the whole installation's intake. A tenant whose policy sets
`capacity.intake_per_second` gets a token bucket of that rate and `capacity.intake_burst`
deliveries per relay process; a push delivery over it is answered `429` with `Retry-After`
before anything is stored, and every provider redelivers after that. Pull sources (mailbox
watchers) pace themselves and are not held here.

The buckets live in the relay's memory: with N relay replicas a tenant's rate is up to N
times the configured one (set it per replica). Nothing is lost by a 429: the delivery was
not stored and the provider keeps it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inboxcrm.domain.policy import PolicyError, UnknownTenant, get_policy


@dataclass
class _Bucket:
    rate: float
    burst: float
    tokens: float
    at: float


@dataclass
class Admission:
    """The token buckets of one relay process, one per tenant with a configured rate."""

    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def retry_after(self, tenant: str) -> int | None:
        """None: admitted (a token taken). Else the whole seconds until one is free."""
        try:
            capacity = get_policy(tenant).capacity
        except (UnknownTenant, PolicyError):
            return None  # the delivery is refused further on, for its own reason
        rate = capacity.intake_per_second
        if rate is None:
            self._buckets.pop(tenant, None)
            return None
        burst = float(capacity.intake_burst)
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None or bucket.rate != rate or bucket.burst != burst:
            bucket = self._buckets[tenant] = _Bucket(rate, burst, burst, now)
        bucket.tokens = min(bucket.burst, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return max(1, math.ceil((1.0 - bucket.tokens) / rate))
