"""The one registry of destination providers: each CRM and mail provider's name, settings,
constructors, sandbox subset and conformance test, declared once in its own module.

A provider is a class in its adapter's module (`inboxcrm/adapters/<provider>.py`),
decorated with `@register`:

    @register
    class PipedriveProvider(CrmProvider[PipedriveDestination]):
        name = "pipedrive"
        destination = PipedriveDestination     # its block in a tenant policy
        sandbox = ("inboxcrm/sandbox/pipedrive.py",)
        conformance = "tests/conformance/test_pipedrive.py"

        def from_settings(self, settings): ...            # the global account (INBOXCRM_*)
        def from_destination(self, spec, settings, secrets): ...  # a tenant's own account

`register` enters the provider here and its destination model in the catalogue of
`schemas.destinations`, which is how a tenant policy and `INBOXCRM_CRM_PROVIDER` learn the
name: it is spelled nowhere else.

The modules are found by discovery (`load_providers` imports every module of this package),
not listed: a list is one more file a new provider must touch and one that can forget it;
importing the infrastructure modules alongside costs nothing, the worker imports them anyway.
`inboxcrm/__init__.py` installs `load_providers` as the catalogue's loader, so every process
that validates a policy (relay, worker, CLI) knows the same providers, and one that never
does (a work-pool child) never imports the adapters. The shape is an interface (`CrmClient`
/ `MailClient` in `base.py`), implementations that build themselves, and a registry keyed by
the configured name.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from inboxcrm.adapters.base import CrmClient, MailClient
from inboxcrm.adapters.transport import AddressGuard
from inboxcrm.schemas.destinations import (
    CrmDestination,
    DestinationRefused,
    DestinationRules,
    MailDestination,
    ProviderDestination,
    SecretRef,
    check_secret,
)

if TYPE_CHECKING:
    from inboxcrm.platform.config import Settings

Kind = Literal["crm", "mail"]
ClientT = TypeVar("ClientT", CrmClient, MailClient)
DestT = TypeVar("DestT", bound=ProviderDestination)
P = TypeVar("P", bound="type[Provider[Any, Any]]")


class ConfigurationError(ValueError):
    """The destination settings are incomplete or contradictory (says which variable)."""


def secret_value(value: object) -> str | None:
    """A plain or pydantic SecretStr setting as text (None when unset or empty)."""
    if value is None:
        return None
    get = getattr(value, "get_secret_value", None)
    text = get() if callable(get) else value
    return str(text) or None


def resolve_secret(ref: SecretRef, what: str, path: Path | None = None) -> str:
    """The secret a policy refers to, read now (a file from `path`, its checked real path,
    when given). The error names where it was looked for, never a value."""
    if ref.env is not None:
        value = os.environ.get(ref.env, "")
    else:
        try:
            value = (path or Path(str(ref.file))).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"{what}: cannot read {ref.describe()}: "
                                     f"{getattr(exc, 'strerror', None) or type(exc).__name__}"
                                     ) from None
    if not value:
        raise ConfigurationError(f"{what}: {ref.describe()} is empty or not set")
    return value


class Secrets:
    """Reads a tenant's secret references for one destination block; errors name the
    tenant, the field and where it was looked for. Given the tenant, a reference outside
    its namespace is refused here too (a file's symlinks are followed at read time, so one
    pointing out of the tenant's directory since the policy loaded is caught)."""

    def __init__(self, what: str, tenant: str | None = None,
                 rules: DestinationRules | None = None) -> None:
        self.what = what  # e.g. "tenant 'north' destinations.crm"
        self.tenant = tenant
        self.rules = rules or DestinationRules()
        # A tenant's clients check every address they connect to (transport.AddressGuard).
        self.guard = AddressGuard(self.rules) if tenant is not None else None

    def get(self, ref: SecretRef, field: str) -> str:
        path = None
        if self.tenant is not None:
            try:
                path = check_secret(self.tenant, ref, self.rules, f"{self.what}.{field}")
            except DestinationRefused as exc:
                raise ConfigurationError(str(exc)) from None
        return resolve_secret(ref, f"{self.what}.{field}", path)

    def optional(self, ref: SecretRef | None, field: str) -> str | None:
        return self.get(ref, field) if ref is not None else None


class Provider(ABC, Generic[ClientT, DestT]):
    """One destination provider. Subclass `CrmProvider` or `MailProvider` and decorate the
    class with `@register`."""

    kind: ClassVar[Kind]
    name: ClassVar[str]
    destination: ClassVar[type[ProviderDestination]]
    # The sandbox modules that stand in for the provider (paths from the repository root),
    # and the conformance test that drives them through the provider's official SDK.
    sandbox: ClassVar[tuple[str, ...]] = ()
    conformance: ClassVar[str | None] = None
    # Where either is missing: why (e.g. SMTP: a real local server stands in instead).
    no_sandbox_reason: ClassVar[str | None] = None
    no_conformance_reason: ClassVar[str | None] = None

    @abstractmethod
    def from_settings(self, settings: Settings) -> ClientT:
        """The global account, from `INBOXCRM_*` settings; a missing required setting is a
        ConfigurationError naming the variable."""

    @abstractmethod
    def from_destination(self, spec: DestT, settings: Settings, secrets: Secrets) -> ClientT:
        """A tenant's own account, from its policy block (already validated by
        `destination`); unset details fall back to the global settings."""

    def for_tenant(self, spec: ProviderDestination, settings: Settings,
                   secrets: Secrets) -> ClientT:
        if not isinstance(spec, self.destination):
            raise ConfigurationError(f"{secrets.what}: a {type(spec).__name__} is not a "
                                     f"{self.name} destination")
        return self.from_destination(spec, settings, secrets)  # type: ignore[arg-type]


class CrmProvider(Provider[CrmClient, DestT]):
    kind: ClassVar[Kind] = "crm"


class MailProvider(Provider[MailClient, DestT]):
    kind: ClassVar[Kind] = "mail"


_CATALOGUES: dict[Kind, type[ProviderDestination]] = {
    "crm": CrmDestination, "mail": MailDestination}
_SETTING: dict[Kind, str] = {"crm": "INBOXCRM_CRM_PROVIDER", "mail": "INBOXCRM_MAIL_PROVIDER"}
_providers: dict[Kind, dict[str, Provider[Any, Any]]] = {"crm": {}, "mail": {}}
_loaded = False


def register(cls: P) -> P:
    """Class decorator: enter the provider (and its policy block) under its name."""
    provider = cls()
    known = _providers[cls.kind].get(cls.name)
    if known is not None and type(known) is not cls:
        raise TypeError(f"{cls.kind} provider {cls.name!r} is registered twice")
    if not cls.sandbox and not cls.no_sandbox_reason:
        raise TypeError(f"{cls.__name__}: name its sandbox modules or say why it has none")
    if cls.conformance is None and not cls.no_conformance_reason:
        raise TypeError(f"{cls.__name__}: name its conformance test or say why it has none")
    _CATALOGUES[cls.kind].register(cls.name, cls.destination)
    _providers[cls.kind][cls.name] = provider
    return cls


def load_providers() -> None:
    """Import every module of this package, so each provider's `@register` has run."""
    global _loaded
    if _loaded:
        return
    package = importlib.import_module(__name__.rpartition(".")[0])
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
        importlib.import_module(f"{package.__name__}.{module}")
    _loaded = True


def providers(kind: Kind) -> dict[str, Provider[Any, Any]]:
    """The registered providers of a kind, by name (sorted)."""
    load_providers()
    return dict(sorted(_providers[kind].items()))


def _lookup(kind: Kind, name: str, what: str | None) -> Provider[Any, Any]:
    found = providers(kind)
    if name not in found:
        raise ConfigurationError(f"{what or _SETTING[kind]} must be one of "
                                 f"{', '.join(found)}, got {name!r}")
    return found[name]


def crm_provider(name: str, what: str | None = None) -> CrmProvider[Any]:
    provider = _lookup("crm", name, what)
    assert isinstance(provider, CrmProvider)
    return provider


def mail_provider(name: str, what: str | None = None) -> MailProvider[Any]:
    provider = _lookup("mail", name, what)
    assert isinstance(provider, MailProvider)
    return provider


def all_providers() -> list[Provider[Any, Any]]:
    """Every registered provider, CRM first (for the recipe check and documentation)."""
    return [*providers("crm").values(), *providers("mail").values()]

