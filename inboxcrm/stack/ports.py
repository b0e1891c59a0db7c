"""Where every listener of the local stack binds, decided in one place.

Each port the stack's settings name is checked against the others, and the workers' metrics
ports are handed out from `INBOXCRM_WORKER_METRICS_PORT` upward *around* those named ports:
with the defaults (first worker 9464, relay metrics 9465) a second worker gets 9466, not the
relay's port, on any number of cores. Pure: `inboxcrm up` checks the ports it plans are free
before it binds them, and a fast test walks the plan for 1…64 workers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

HIGHEST_PORT = 65535


class PortConflict(ValueError):
    """Two of the stack's own settings name one port, or the workers run out of ports."""


@dataclass(frozen=True)
class PortPlan:
    named: dict[str, int]          # setting (environment variable) -> port, workers aside
    workers: tuple[int, ...]       # metrics port of worker 1, 2, …

    def all_ports(self) -> list[int]:
        return [*self.named.values(), *self.workers]


def plan_ports(named: Iterable[tuple[str, int | None]], *, first_worker_port: int,
               workers: int) -> PortPlan:
    """`named`: (setting, port) for each listener the stack starts itself (None: not started,
    e.g. PostgreSQL when DATABASE_URL is given). The first worker's port is a named setting
    too (`INBOXCRM_WORKER_METRICS_PORT`), so it cannot silently sit on another listener."""
    taken: dict[int, str] = {}
    chosen: dict[str, int] = {}
    for setting, port in [*named, ("INBOXCRM_WORKER_METRICS_PORT", first_worker_port)]:
        if port is None:
            continue
        if not 0 < port <= HIGHEST_PORT:
            raise PortConflict(f"{setting}={port} is not a TCP port (1-{HIGHEST_PORT})")
        if port in taken:
            raise PortConflict(f"{taken[port]} and {setting} both name port {port}: "
                               f"set one of them to another port")
        taken[port] = setting
        chosen[setting] = port
    del chosen["INBOXCRM_WORKER_METRICS_PORT"]  # it is workers[0]
    ports = [first_worker_port]
    candidate = first_worker_port + 1
    while len(ports) < workers:
        if candidate > HIGHEST_PORT:
            raise PortConflict(f"{workers} workers need {workers} metrics ports from "
                               f"INBOXCRM_WORKER_METRICS_PORT={first_worker_port} up; only "
                               f"{len(ports)} are left below {HIGHEST_PORT + 1}")
        if candidate not in taken:
            ports.append(candidate)
        candidate += 1
    return PortPlan(named=chosen, workers=tuple(ports[:max(workers, 0)]))
