"""The whole local stack, as `inboxcrm up` runs it and as the tests run it.

Every component is a real process on loopback: embedded PostgreSQL (unless DATABASE_URL),
the Temporal dev server (unless TEMPORAL_ADDRESS), the sandbox CRM/mail service, the worker
and the relay.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import TypeAdapter

from inboxcrm.platform.config import Settings
from inboxcrm.schemas.contract import DEFAULT_TASK_QUEUE
from inboxcrm.stack import postgres
from inboxcrm.stack.ports import PortConflict, PortPlan, plan_ports
from inboxcrm.stack.processes import (
    ROOT,
    ManagedProcess,
    StackError,
    http_ok,
    python,
    require_free,
    tcp_open,
    temporal_dev_server_argv,
)
from inboxcrm.store.migrate import apply_migrations

WORKER_READY = "worker running on task queue"


def worker_count(environ: Mapping[str, str], cpus: int | None) -> int:
    """How many worker processes `inboxcrm up` starts: `INBOXCRM_WORKERS`, else one per core.

    A Python worker process keeps about one core busy (workflow tasks and activities share
    its event loop), so a single one leaves the other cores of the machine idle."""
    value = environ.get("INBOXCRM_WORKERS", "").strip()
    if not value:
        return max(cpus or 1, 1)
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise StackError(f"INBOXCRM_WORKERS must be a whole number of at least 1, "
                         f"not {value!r} (unset: one worker per core)")
    return count


def worker_name(index: int) -> str:
    """`worker`, `worker-2`, … (process and log file name of the index-th worker, from 1)."""
    return "worker" if index == 1 else f"worker-{index}"


@dataclass
class StackConfig:
    data_dir: Path = ROOT / ".data"
    pg_port: int = 55432
    temporal_port: int = 7233
    temporal_ui_port: int | None = 8233
    temporal_db_file: bool = True            # file-backed under data_dir (False: in memory)
    sandbox_port: int = 8090
    relay_port: int = 8080
    relay_metrics_port: int = 9465           # the relay's internal metrics listener
    worker_metrics_port: int = 9464          # the first worker's; the others: ports.plan_ports
    workers: int = 1                         # worker processes (`inboxcrm up`: one per core)
    database_url: str | None = None          # external PostgreSQL
    temporal_address: str | None = None      # external Temporal
    task_queue: str = DEFAULT_TASK_QUEUE
    extra_env: dict[str, str] = field(default_factory=dict)


def _db_role(cfg: StackConfig) -> bool:
    """INBOXCRM_DB_ROLE as the stack's processes will read it (its extra_env first), parsed
    as the setting is, without building the whole Settings (which a shell with no variables,
    `make up`'s, would refuse outside INBOXCRM_ENV=local)."""
    value = cfg.extra_env.get("INBOXCRM_DB_ROLE", os.environ.get("INBOXCRM_DB_ROLE"))
    if value is None:
        return bool(Settings.model_fields["db_role"].default)
    return TypeAdapter(bool).validate_python(value)


@dataclass
class Stack:
    config: StackConfig
    database_url: str = ""
    temporal_address: str = ""
    env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    started_postgres: bool = False
    _ready: dict[str, Callable[[], bool]] = field(default_factory=dict)

    @property
    def log_dir(self) -> Path:
        return self.config.data_dir / "logs"

    @property
    def relay_url(self) -> str:
        return f"http://127.0.0.1:{self.config.relay_port}"

    @property
    def relay_metrics_url(self) -> str:
        """The relay's metrics (an internal listener: not on the relay's public port)."""
        return f"http://127.0.0.1:{self.config.relay_metrics_port}/metrics"

    @property
    def sandbox_url(self) -> str:
        return f"http://127.0.0.1:{self.config.sandbox_port}"

    @property
    def temporal_ui_url(self) -> str:
        if self.config.temporal_address or self.config.temporal_ui_port is None:
            return ""
        return f"http://127.0.0.1:{self.config.temporal_ui_port}"

    def port_plan(self, workers: int | None = None) -> PortPlan:
        """Every listener the stack starts, none on another's port (ports.py). `workers`:
        plan for that many (a further worker started beside the configured ones)."""
        cfg = self.config
        own_temporal = not cfg.temporal_address
        return plan_ports(
            [("INBOXCRM_PG_PORT", None if cfg.database_url else cfg.pg_port),
             ("INBOXCRM_TEMPORAL_PORT", cfg.temporal_port if own_temporal else None),
             ("INBOXCRM_TEMPORAL_UI_PORT", cfg.temporal_ui_port if own_temporal else None),
             ("INBOXCRM_SANDBOX_PORT", cfg.sandbox_port),
             ("INBOXCRM_RELAY_PORT", cfg.relay_port),
             ("INBOXCRM_RELAY_METRICS_PORT", cfg.relay_metrics_port)],
            first_worker_port=cfg.worker_metrics_port,
            workers=max(cfg.workers, workers or 0))

    def check_ports(self) -> None:
        """A collision between two of the stack's own settings, said as exactly that
        before anything starts."""
        try:
            self.port_plan()
        except PortConflict as exc:
            raise StackError(str(exc)) from None

    def start_infrastructure(self) -> None:
        """PostgreSQL, Temporal and the sandbox; then migrations and the environment."""
        self.check_ports()
        cfg = self.config
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        if cfg.database_url:
            self.database_url = cfg.database_url
        else:
            pg_dir = cfg.data_dir / "pg"
            if not postgres.is_running(pg_dir):
                require_free("PostgreSQL", "127.0.0.1", cfg.pg_port, "INBOXCRM_PG_PORT")
            self.database_url = postgres.start(pg_dir, cfg.pg_port)
            self.started_postgres = True
        asyncio.run(apply_migrations(self.database_url, roles=_db_role(cfg)))
        if cfg.temporal_address:
            self.temporal_address = cfg.temporal_address
        else:
            require_free("Temporal", "127.0.0.1", cfg.temporal_port, "INBOXCRM_TEMPORAL_PORT")
            if cfg.temporal_ui_port is not None:
                require_free("Temporal UI", "127.0.0.1", cfg.temporal_ui_port,
                             "INBOXCRM_TEMPORAL_UI_PORT")
            db_file = cfg.data_dir / "temporal.db" if cfg.temporal_db_file else None
            # The UI calls <endpoint>/decode and /encode: the relay's codec routes (codec.py).
            codec_endpoint = f"{self.relay_url}/codec" if cfg.temporal_ui_port is not None else None
            argv = temporal_dev_server_argv(cfg.temporal_port, cfg.temporal_ui_port, db_file,
                                            codec_endpoint=codec_endpoint,
                                            namespaces=self.tenant_namespaces())
            self._start("temporal", argv, tcp_open("127.0.0.1", cfg.temporal_port), env=os.environ)
            self.temporal_address = f"127.0.0.1:{cfg.temporal_port}"
        self.env = self._app_env()
        if cfg.temporal_address and self.tenant_namespaces():
            self.register_namespaces()
        require_free("sandbox", "127.0.0.1", cfg.sandbox_port, "INBOXCRM_SANDBOX_PORT")
        self._start("sandbox", python("inboxcrm.sandbox") + ["--port", str(cfg.sandbox_port)],
                    http_ok(f"{self.sandbox_url}/healthz"))

    def tenant_namespaces(self) -> list[str]:
        """The tenants' own namespaces (INBOXCRM_TENANT_NAMESPACES of the stack's settings
        over the policies it runs with); none by default: everyone in the shared one."""
        from inboxcrm.domain.policy import load_policies
        from inboxcrm.platform.temporal import parse_tenant_namespaces

        value = self.config.extra_env.get("INBOXCRM_TENANT_NAMESPACES",
                                          os.environ.get("INBOXCRM_TENANT_NAMESPACES", ""))
        if not value.strip():
            return []
        policy_dir = (self.config.extra_env.get("INBOXCRM_POLICY_DIR")
                      or os.environ.get("INBOXCRM_POLICY_DIR") or str(ROOT / "policies"))
        shared = self.config.extra_env.get("INBOXCRM_TEMPORAL_NAMESPACE",
                                           os.environ.get("INBOXCRM_TEMPORAL_NAMESPACE",
                                                          "default"))
        mapping = parse_tenant_namespaces(value, shared)
        tenants = sorted(load_policies(Path(policy_dir)))
        mapping.check(tenants)
        return mapping.served(tenants)[1:]

    def register_namespaces(self) -> list[str]:
        """An external Temporal (a test's shared dev server): the tenants' namespaces
        registered, as `deploy/bootstrap.py` does in a deployment (idempotent)."""
        from inboxcrm.platform import temporal

        settings = self.settings()

        async def register() -> list[str]:
            client = await temporal.connect(settings)
            return await temporal.ensure_namespaces(client, self.tenant_namespaces())

        return asyncio.run(register())

    def start_worker(self, index: int = 1) -> ManagedProcess:
        """Start (or restart, after a kill) the index-th worker process and wait until it
        polls; each has its own metrics port, as replicas on one host need."""
        proc = self._spawn_worker(index)
        proc.wait_ready(proc.log_has(WORKER_READY, since=proc.log_offset))
        return proc

    def start_workers(self) -> list[ManagedProcess]:
        """`config.workers` processes on the one task queue. The first registers the search
        attributes alone; the others then start side by side."""
        first = self.start_worker(1)
        others = [self._spawn_worker(index) for index in range(2, self.config.workers + 1)]
        for proc in others:
            proc.wait_ready(proc.log_has(WORKER_READY, since=proc.log_offset))
        return [first, *others]

    def worker_metrics_address(self, index: int) -> str:
        return f"127.0.0.1:{self.port_plan(index).workers[index - 1]}"

    def _spawn_worker(self, index: int) -> ManagedProcess:
        address = self.worker_metrics_address(index)
        require_free(f"{worker_name(index)} metrics", "127.0.0.1",
                     int(address.rpartition(":")[2]), "INBOXCRM_WORKER_METRICS_PORT")
        env = dict(self.env, INBOXCRM_WORKER_METRICS_ADDRESS=address)
        return self._start(worker_name(index), python("inboxcrm.worker"), None, env=env)

    def start_relay(self) -> ManagedProcess:
        require_free("relay", "127.0.0.1", self.config.relay_port, "INBOXCRM_RELAY_PORT")
        require_free("relay metrics", "127.0.0.1", self.config.relay_metrics_port,
                     "INBOXCRM_RELAY_METRICS_PORT")
        return self._start("relay", python("inboxcrm.ingress.main"),
                           http_ok(f"{self.relay_url}/healthz"))

    def start_all(self) -> None:
        self.start_infrastructure()
        self.start_workers()
        self.register_schedules()
        self.start_relay()

    def register_schedules(self) -> str:
        """The product's Temporal Schedules (drift check, review notices, consent sync,
        retention), as `deploy/bootstrap.py` registers them in a deployment (idempotent: a
        restart updates them to the current settings). Returns the drift check's outcome."""
        from inboxcrm.platform import temporal
        from inboxcrm.schemas.contract import drift_check_schedule_id

        settings = self.settings()

        async def register() -> str:
            client = await temporal.connect(settings)
            outcomes = await temporal.ensure_schedules(client, settings)
            return outcomes[drift_check_schedule_id(settings.task_queue)]

        return asyncio.run(register())

    def stop(self) -> None:
        for proc in reversed(list(self.processes.values())):
            proc.stop()
        if self.started_postgres:
            postgres.stop(self.config.data_dir / "pg")

    def _start(self, name: str, argv: list[str], ready: Callable[[], bool] | None,
               env: os._Environ[str] | dict[str, str] | None = None) -> ManagedProcess:
        proc = ManagedProcess(name, argv, dict(env if env is not None else self.env),
                              self.log_dir).start()
        self.processes[name] = proc
        if callable(ready):
            self._ready[name] = ready
            proc.wait_ready(ready)
        return proc

    def restart(self, name: str) -> ManagedProcess:
        """Start one of the stack's processes again, as it was first started, after it
        died: `inboxcrm up` outlives a worker's (or the relay's) death, as a deployment
        does (its supervisor restarts the pod)."""
        if name == "worker" or name.startswith("worker-"):
            return self.start_worker(int(name.removeprefix("worker-")) if "-" in name else 1)
        proc = self.processes[name]
        proc.start()
        if name in self._ready:
            proc.wait_ready(self._ready[name])
        return proc

    def _app_env(self) -> dict[str, str]:
        from inboxcrm.platform.codec import ensure_key_file
        from inboxcrm.stack.credentials import generated_credentials

        # Payload encryption keys: kept in .data/ (mode 0600), never in the repository.
        keys_file = Path(self.config.extra_env.get("INBOXCRM_CODEC_KEYS_FILE")
                         or os.environ.get("INBOXCRM_CODEC_KEYS_FILE")
                         or self.config.data_dir / "codec-keys.json")
        ensure_key_file(keys_file)
        env = dict(os.environ)
        # The demo tenants live in the repository, not in the image: the local stack points
        # the policy directory at them unless one is given.
        env.setdefault("INBOXCRM_POLICY_DIR", str(ROOT / "policies"))
        if not self.config.temporal_address:
            # The stack's own dev server: a Temporal profile or TEMPORAL_* variables of the
            # shell (a developer's Temporal Cloud, say) must not redirect its processes.
            env = {k: v for k, v in env.items() if not k.startswith("TEMPORAL_")}
        if self.temporal_ui_url and not env.get("INBOXCRM_CODEC_CORS_ORIGINS"):
            port = self.config.temporal_ui_port
            env["INBOXCRM_CODEC_CORS_ORIGINS"] = f"http://127.0.0.1:{port},http://localhost:{port}"
        env.update({
            "DATABASE_URL": self.database_url,
            "TEMPORAL_ADDRESS": self.temporal_address,
            "INBOXCRM_SANDBOX_URL": self.sandbox_url,
            "INBOXCRM_ENV": "local",
            # The local sandbox (and a test's own sandboxes) listen on loopback over http:
            # the operator's allow-list lets tenants' destinations use them.
            "INBOXCRM_DESTINATION_HOSTS_ALLOWED": env.get("INBOXCRM_DESTINATION_HOSTS_ALLOWED")
            or "127.0.0.1,localhost",
            "INBOXCRM_RELAY_PORT": str(self.config.relay_port),
            "INBOXCRM_RELAY_METRICS_ADDRESS": f"127.0.0.1:{self.config.relay_metrics_port}",
            "RELAY_URL": self.relay_url,
            "INBOXCRM_TASK_QUEUE": self.config.task_queue,
            "INBOXCRM_WORKER_METRICS_ADDRESS": self.worker_metrics_address(1),
            "INBOXCRM_WEBHOOK_SECRET": webhook_secret(self.config.data_dir),
            # Postmark basic auth, Mailgun signing key, unsubscribe secret, review token,
            # globex's own webhook secret (.data/, 0600)
            **generated_credentials(self.config.data_dir),
            "INBOXCRM_CODEC_KEYS_FILE": str(keys_file),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.config.extra_env)
        return env

    def settings(self) -> Settings:
        """The settings the stack's own processes run with (same codec keys, same queue)."""
        from unittest import mock

        values = {k: v for k, v in self.env.items()
                  if k.startswith("INBOXCRM_") or k in ("DATABASE_URL", "TEMPORAL_ADDRESS")}
        with mock.patch.dict(os.environ, values):
            return Settings()

    def stack_env(self) -> dict[str, str]:
        """What `.data/stack.env` holds (docs/architecture.md §10): what a client of the
        stack needs first, then every other setting its processes run with, so that a
        further worker or relay started from this file alone (`set -a; . .data/stack.env`)
        runs as the stack's own do (round three's file lacked the unsubscribe secret, and
        a worker started from it refused every follow-up)."""
        first = self._client_env()
        further_worker = self.worker_metrics_address(self.config.workers + 1)
        rest = {key: value for key, value in sorted(self.env.items())
                if key.startswith("INBOXCRM_") and key not in first}
        # A further worker on this host takes the next port of the plan, not worker 1's.
        rest["INBOXCRM_WORKER_METRICS_ADDRESS"] = further_worker
        return {**first, **rest}

    def _client_env(self) -> dict[str, str]:
        return {
            "DATABASE_URL": self.database_url,
            "TEMPORAL_ADDRESS": self.temporal_address,
            "TEMPORAL_UI_URL": self.temporal_ui_url,
            "RELAY_URL": self.relay_url,
            "SANDBOX_URL": self.sandbox_url,
            "INBOXCRM_WEBHOOK_SECRET": self.env["INBOXCRM_WEBHOOK_SECRET"],
            "INBOXCRM_WEBHOOK_SECRET_GLOBEX": self.env["INBOXCRM_WEBHOOK_SECRET_GLOBEX"],
            "INBOXCRM_POSTMARK_USER": self.env["INBOXCRM_POSTMARK_USER"],
            "INBOXCRM_POSTMARK_PASSWORD": self.env["INBOXCRM_POSTMARK_PASSWORD"],
            "INBOXCRM_MAILGUN_SIGNING_KEY": self.env["INBOXCRM_MAILGUN_SIGNING_KEY"],
            "INBOXCRM_REVIEW_TOKEN": self.env["INBOXCRM_REVIEW_TOKEN"],
            "INBOXCRM_DECISION_SECRET": self.env["INBOXCRM_DECISION_SECRET"],
            "INBOXCRM_TASK_QUEUE": self.config.task_queue,
            "INBOXCRM_CODEC_KEYS_FILE": self.env["INBOXCRM_CODEC_KEYS_FILE"],
            # The CLI next to this stack runs under the local stack's rules, as its processes.
            "INBOXCRM_ENV": "local",
            "INBOXCRM_POLICY_DIR": self.env["INBOXCRM_POLICY_DIR"],
            "RELAY_METRICS_URL": self.relay_metrics_url,
            "WORKER_METRICS_URL": f"http://{self.worker_metrics_address(1)}/metrics",
            # One endpoint per worker process (the first is WORKER_METRICS_URL).
            "WORKER_METRICS_URLS": ",".join(
                f"http://{self.worker_metrics_address(index)}/metrics"
                for index in range(1, self.config.workers + 1)),
        }

    def write_stack_env(self) -> Path:
        path = self.config.data_dir / "stack.env"
        lines = [f"{key}={shlex.quote(value)}" for key, value in self.stack_env().items()]
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)
        return path


@dataclass
class RestartBudget:
    """How often `inboxcrm up` restarts one process before it calls it a crash loop and
    stops the stack (a process that dies at every start would otherwise hide its error
    behind endless restarts)."""

    limit: int = 3
    window_seconds: float = 300.0
    _restarts: dict[str, list[float]] = field(default_factory=dict)

    def allow(self, name: str, now: float) -> bool:
        recent = [t for t in self._restarts.get(name, []) if now - t < self.window_seconds]
        if len(recent) >= self.limit:
            self._restarts[name] = recent
            return False
        self._restarts[name] = [*recent, now]
        return True


def webhook_secret(data_dir: Path) -> str:
    """The relay's Standard Webhooks secret: from the environment, else generated once per
    data directory (kept in .data/, never in the repository)."""
    if os.environ.get("INBOXCRM_WEBHOOK_SECRET"):
        return os.environ["INBOXCRM_WEBHOOK_SECRET"]
    path = data_dir / "webhook.secret"
    if not path.exists():
        from inboxcrm.stack.credentials import new_webhook_secret

        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(new_webhook_secret() + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


# Short client timeouts so timeout faults resolve quickly; the sandbox holds a hung request
# longer than the client waits, as a slow real provider would; a fast sweeper.
ISOLATED_ENV = {
    "INBOXCRM_HTTP_TIMEOUT_SECONDS": "2",
    "INBOXCRM_SWEEPER_INTERVAL_SECONDS": "1",
    "INBOXCRM_FAILED_RUN_CHECK_SECONDS": "2",
    "INBOXCRM_RELAY_METRICS_INTERVAL_SECONDS": "1",
    "SANDBOX_HANG_SECONDS": "6",
    "SANDBOX_SEARCH_LAG_SECONDS": "2",
}


def isolated_config(data_dir: Path, database_url: str, *, queue_prefix: str,
                    ui: bool = False, temporal_address: str | None = None,
                    extra_env: dict[str, str] | None = None, workers: int = 1) -> StackConfig:
    """A stack on free loopback ports with its own task queue and the short timeouts above:
    the test suite, the UI tests and the chaos driver each run one beside anything else."""
    import uuid

    from inboxcrm.stack.processes import free_port

    return StackConfig(
        data_dir=data_dir,
        temporal_port=free_port(),
        temporal_ui_port=free_port() if ui else None,
        temporal_db_file=False,
        sandbox_port=free_port(),
        relay_port=free_port(),
        relay_metrics_port=free_port(),
        worker_metrics_port=free_port(),
        database_url=database_url,
        temporal_address=None if ui else temporal_address,
        task_queue=f"{queue_prefix}-{uuid.uuid4().hex[:6]}",
        extra_env={**ISOLATED_ENV, **(extra_env or {})},
        workers=workers,
    )
