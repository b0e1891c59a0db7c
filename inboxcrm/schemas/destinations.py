"""A tenant's own destinations, as its policy file states them (`policies/README.md`).

The tenant policy (`inboxcrm.domain.policy`) validates this block when it loads; the adapter
factory (`inboxcrm.adapters.factory`) builds the tenant's clients from it. Both rooms read
these types, so they live here, below both (docs/architecture.md §9).

What a provider's block holds is the provider's own business: each adapter module in
`inboxcrm/adapters/` defines its block as a subclass of `CrmDestination` or
`MailDestination`, and the adapter registry (`inboxcrm.adapters.registry`) enters it here
under the provider's name when the product is imported. A block is then validated by the
model its `provider` names; a name nobody registered is refused with the list of those
that are. This room keeps only what every provider shares: the secret references, the
by-reference rule and the catalogue. The catalogue is filled at its first lookup by the
loaders the product installed (`schemas.DESTINATION_LOADERS`), so this room imports none.

Secrets are given **by reference**, never inline: `{"env": "VAR"}` (an environment variable
of the worker) or `{"file": "/path"}` (a mounted secret file, its content stripped of
surrounding whitespace). Every field typed `SecretRef` (or `SecretRef | None`) takes a
reference only, so a policy file holding a secret's value fails to load, and no error
message ever repeats what was written in a secret's place.

Secrets stay with their tenant (`check_destinations`, run when a policy loads and again when
a destination is built): a tenant's reference names only its own namespace, an environment
variable `INBOXCRM_TENANT_<TENANT>_*` (the tenant upper-cased, `-` written `_`) or a file under
`INBOXCRM_TENANT_SECRETS_DIR/<tenant>/` (no `..`, no symlink out of it). Endpoints are https
on the hosts the provider documents (`documented_hosts` of its block, in its adapter
module); any other host, plain http, and private, loopback or link-local addresses only where
the operator lists the host in `INBOXCRM_DESTINATION_HOSTS_ALLOWED` (a setting, never the
policy). The adapters refuse such addresses again after DNS resolution, at connect time.
"""

from __future__ import annotations

import ipaddress
import os
import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core.core_schema import ValidatorFunctionWrapHandler

import inboxcrm.schemas as schemas

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_FIELD = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
INLINE_SECRET = ('a secret is given by reference ({"env": "VAR"} or {"file": "/path"}), '
                 "never inline in the policy file")


TENANT_ENV_PREFIX = "INBOXCRM_TENANT_"
HOSTS_SETTING = "INBOXCRM_DESTINATION_HOSTS_ALLOWED"
SECRETS_DIR_SETTING = "INBOXCRM_TENANT_SECRETS_DIR"


def tenant_env_suffix(tenant: str) -> str:
    """`globex` -> `GLOBEX`, `north-east` -> `NORTH_EAST` (the name of its variables)."""
    return tenant.upper().replace("-", "_")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_is_internal(host: str) -> bool:
    """True for an IP address that is not public: private, loopback, link-local (the cloud
    metadata service), shared, reserved, multicast or unspecified. Not an address: False."""
    ip = _address(host)
    return ip is not None and (not ip.is_global or ip.is_multicast)


def _host_matches(host: str, pattern: str) -> bool:
    """`api.hubapi.com` matches itself; `*.salesforce.com` any name below it (not itself)."""
    host, pattern = host.lower().rstrip("."), pattern.lower().rstrip(".")
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


@dataclass(frozen=True)
class DestinationRules:
    """The operator's side of the destination rules (settings, never a policy): the hosts a
    tenant's destination may use beyond its provider's documented ones (names, `*.domain`,
    IP addresses or networks; these may be http and internal), and the directory of the
    tenants' secret files."""

    hosts_allowed: tuple[str, ...] = ()
    secrets_dir: str | None = None

    @classmethod
    def parse(cls, hosts: str | None, secrets_dir: str | None) -> DestinationRules:
        entries = tuple(h.strip().lower() for h in (hosts or "").split(",") if h.strip())
        return cls(entries, secrets_dir or None)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> DestinationRules:
        env = os.environ if environ is None else environ
        return cls.parse(env.get(HOSTS_SETTING), env.get(SECRETS_DIR_SETTING))

    def _networks(self) -> Iterator[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        for entry in self.hosts_allowed:
            try:
                yield ipaddress.ip_network(entry.strip("[]"), strict=False)
            except ValueError:
                continue

    def host_allowed(self, host: str) -> bool:
        """Whether the operator allows this host (by name, pattern, or its address)."""
        if any(_host_matches(host, entry) for entry in self.hosts_allowed):
            return True
        return self.address_allowed(host, internal_only=True)

    def address_allowed(self, address: str, *, internal_only: bool = False) -> bool:
        """Whether a resolved address may be connected to: a public one, or one inside an
        address or network the operator lists."""
        ip = _address(address)
        if ip is None:
            return False
        if not internal_only and not address_is_internal(address):
            return True
        return any(ip in net for net in self._networks())

    def tenant_dir(self, tenant: str) -> Path | None:
        return Path(self.secrets_dir) / tenant if self.secrets_dir else None


class DestinationRefused(ValueError):
    """A destination the rules refuse: one line naming the field and the rule, never a
    secret's value."""


def _namespace_rule(tenant: str, rules: DestinationRules) -> str:
    where = f"{TENANT_ENV_PREFIX}{tenant_env_suffix(tenant)}_* variables"
    folder = rules.tenant_dir(tenant)
    files = f"files under {folder}/" if folder else f"files under {SECRETS_DIR_SETTING}/{tenant}/"
    return f"tenant {tenant!r} may read secrets only from {where} or {files}"


def check_secret(tenant: str, ref: SecretRef, rules: DestinationRules, where: str) -> Path | None:
    """Refuse a reference outside the tenant's namespace; a file reference's resolved path
    (symlinks followed, still inside the tenant's directory), else None."""
    if ref.env is not None:
        prefix = f"{TENANT_ENV_PREFIX}{tenant_env_suffix(tenant)}_"
        if not (ref.env.startswith(prefix) and len(ref.env) > len(prefix)):
            raise DestinationRefused(f"{where}: {ref.describe()} is outside the tenant's "
                                     f"namespace ({_namespace_rule(tenant, rules)})")
        return None
    folder = rules.tenant_dir(tenant)
    path = PurePosixPath(str(ref.file))
    if folder is None or ".." in path.parts:
        raise DestinationRefused(f"{where}: {ref.describe()} is outside the tenant's "
                                 f"namespace ({_namespace_rule(tenant, rules)})")
    base = os.path.realpath(folder)
    lexical = os.path.normpath(str(path))
    resolved = os.path.realpath(lexical)
    inside = [p for p in (lexical, resolved)
              if p.startswith(os.path.normpath(str(folder)) + os.sep)
              or p.startswith(base + os.sep)]
    if len(inside) < 2:
        raise DestinationRefused(f"{where}: {ref.describe()} is outside the tenant's "
                                 f"namespace ({_namespace_rule(tenant, rules)}; symlinks "
                                 "out of it are refused)")
    return Path(resolved)


def check_endpoint(where: str, url: str, documented: tuple[str, ...],
                   rules: DestinationRules, *, secure: tuple[str, ...] = ("https",)) -> None:
    """Refuse an endpoint that is not https on a documented host, unless the operator allows
    its host. Names the host, never the rest of the URL."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        _ = parts.port
    except ValueError:
        raise DestinationRefused(f"{where}: not a URL") from None
    if not host:
        raise DestinationRefused(f"{where}: not a URL with a host")
    if parts.username is not None or parts.password is not None:
        raise DestinationRefused(f"{where}: credentials in a URL are refused (give them by "
                                 "reference)")
    if rules.host_allowed(host):
        return
    allow = f"(or the operator lists the host in {HOSTS_SETTING})"
    if address_is_internal(host):
        raise DestinationRefused(f"{where}: {host} is a private, loopback or link-local "
                                 f"address; refused {allow}")
    if parts.scheme not in secure:
        raise DestinationRefused(f"{where}: {parts.scheme or 'no scheme'}:// to {host} is "
                                 f"refused: destinations use {'/'.join(secure)} {allow}")
    if not any(_host_matches(host, pattern) for pattern in documented):
        known = ", ".join(documented) or "none: every host must be allowed by the operator"
        raise DestinationRefused(f"{where}: host {host} is not one the provider documents "
                                 f"({known}) {allow}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretRef(_Strict):
    """Where a secret is read from when the destination is built: exactly one of the two."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError('give exactly one of "env" and "file"')
        if self.env is not None and not _ENV_NAME.match(self.env):
            raise ValueError("env must be an environment variable name")
        if self.file is not None and not self.file.startswith("/"):
            raise ValueError("file must be an absolute path")
        return self

    def describe(self) -> str:
        """Where the secret comes from (for error messages; never its value)."""
        return f"environment variable {self.env}" if self.env else f"file {self.file}"


def field_name(value: str | None) -> str | None:
    """A provider field or property name (letters, digits, underscores), or None."""
    if value is not None and not _FIELD.match(value):
        raise ValueError("must be a field name (letters, digits, underscores)")
    return value


def _load_providers() -> None:
    """Run the installed loaders once (each is taken off the list before it runs)."""
    while schemas.DESTINATION_LOADERS:
        schemas.DESTINATION_LOADERS.pop(0)()


@cache
def _secret_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields that hold only a secret: typed `SecretRef` or `SecretRef | None`."""
    names = set()
    for name, info in model.model_fields.items():
        kind = info.annotation
        if get_origin(kind) in (Union, types.UnionType):
            members = tuple(a for a in get_args(kind) if a is not type(None))
        else:
            members = (kind,)
        if members == (SecretRef,):
            names.add(name)
    return frozenset(names)


class SettingsBlock(_Strict):
    """A block of a provider's settings (its destination, or a part of it such as an OAuth
    client): strict, and its secret fields take references only."""

    @field_validator("*", mode="before")
    @classmethod
    def _secrets_by_reference(cls, value: Any, info: ValidationInfo) -> Any:
        if (info.field_name in _secret_fields(cls) and value is not None
                and not isinstance(value, dict | SecretRef)):
            raise ValueError(INLINE_SECRET)
        return value


class ProviderDestination(SettingsBlock):
    """A tenant's account at one provider. `CrmDestination` and `MailDestination` are the
    two kinds; each keeps the catalogue of its providers' models, filled by `register`."""

    kind: ClassVar[str]
    _catalogue: ClassVar[dict[str, type[ProviderDestination]]]
    # The hosts the provider documents for its API (`*.domain`: any name below it); a block
    # naming another host needs the operator's INBOXCRM_DESTINATION_HOSTS_ALLOWED.
    documented_hosts: ClassVar[tuple[str, ...]] = ()
    provider: str

    def endpoints(self) -> list[tuple[str, str]]:
        """(field, URL) of every endpoint this block names (unset ones are the provider's
        documented default or the operator's settings). A protocol other than HTTP names
        its scheme, with an `s` at its end when the session is encrypted."""
        return []

    @classmethod
    def register(cls, name: str, model: type[ProviderDestination]) -> None:
        """Enter `model` as the block of provider `name` (the adapter registry calls this;
        a second, different model under one name is a programming error)."""
        if not issubclass(model, cls) or "_catalogue" in model.__dict__:
            raise TypeError(f"{model.__name__} is not a {cls.kind} provider's destination")
        known = cls._catalogue.get(name)
        if known is not None and known is not model:
            raise TypeError(f"{cls.kind} provider {name!r} is registered twice")
        cls._catalogue[name] = model

    @classmethod
    def known(cls) -> tuple[str, ...]:
        """The registered provider names, sorted (what an error message lists)."""
        _load_providers()
        return tuple(sorted(_catalogue_of(cls)))

    @classmethod
    def check_provider(cls, name: object) -> str:
        """`name` if a provider of this kind is registered under it; else a ValueError that
        names the known ones."""
        _load_providers()
        if isinstance(name, str) and name in _catalogue_of(cls):
            return name
        known = ", ".join(cls.known()) or "none are registered (import inboxcrm)"
        raise ValueError(f"unknown {cls.kind} provider {name!r} (known: {known})")

    @model_validator(mode="wrap")
    @classmethod
    def _by_provider(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A block given to the kind (`CrmDestination`) is validated by its provider's
        model; a provider's model checks that the block names it."""
        if "_catalogue" in cls.__dict__ and isinstance(data, Mapping):
            name = cls.check_provider(data.get("provider"))
            return _catalogue_of(cls)[name].model_validate(dict(data))
        result = handler(data)
        if "_catalogue" not in cls.__dict__ and isinstance(result, ProviderDestination):
            owner = [n for n, m in _catalogue_of(cls).items() if m is cls]
            if owner and result.provider not in owner:
                raise ValueError(f"provider must be {owner[0]!r} for {cls.__name__}")
        return result


    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by value through its kind: a process that has loaded the provider's
        module gets the provider's model back; one that never loaded the adapters (a
        work-pool child, handed a tenant's policy to extract a message with) gets the kind
        with the provider's name only, instead of importing every adapter inside a budgeted
        call."""
        kind = next(base for base in type(self).__mro__ if "_catalogue" in base.__dict__)
        return (_unpickle, (kind, self.model_dump()))


def _unpickle(kind: type[ProviderDestination], data: dict[str, Any]) -> ProviderDestination:
    model = kind.__dict__["_catalogue"].get(data.get("provider"))  # no loader runs here
    if model is not None:
        block: ProviderDestination = model.model_validate(data)
        return block
    return kind.model_construct(provider=str(data.get("provider")))


def _catalogue_of(model: type[ProviderDestination]) -> dict[str, type[ProviderDestination]]:
    for base in model.__mro__:
        if "_catalogue" in base.__dict__:
            catalogue: dict[str, type[ProviderDestination]] = base.__dict__["_catalogue"]
            return catalogue
    return {}


class CrmDestination(ProviderDestination):
    """A tenant's CRM account; the model its `provider` names holds the rest."""

    kind: ClassVar[str] = "CRM"
    _catalogue: ClassVar[dict[str, type[ProviderDestination]]] = {}


class MailDestination(ProviderDestination):
    """A tenant's mail account; the model its `provider` names holds the rest."""

    kind: ClassVar[str] = "mail"
    _catalogue: ClassVar[dict[str, type[ProviderDestination]]] = {}


class TenantDestinations(_Strict):
    """Unset parts use the global settings (`INBOXCRM_CRM_PROVIDER`, `INBOXCRM_MAIL_*`)."""

    # SerializeAsAny: a block dumps as its provider's model (every field), not as the kind.
    crm: SerializeAsAny[CrmDestination] | None = None
    mail: SerializeAsAny[MailDestination] | None = None


def secret_refs(block: BaseModel, prefix: str = "") -> Iterator[tuple[str, SecretRef]]:
    """(field path, reference) of every secret reference in a block, nested blocks too."""
    for name in type(block).model_fields:
        value = getattr(block, name)
        if isinstance(value, SecretRef):
            yield f"{prefix}{name}", value
        elif isinstance(value, BaseModel):
            yield from secret_refs(value, f"{prefix}{name}.")


def check_block(tenant: str, kind: str, block: ProviderDestination,
                rules: DestinationRules) -> None:
    """Refuse a block whose secrets leave the tenant's namespace or whose endpoints leave
    the provider's documented https hosts (DestinationRefused, one line)."""
    for field, ref in secret_refs(block):
        check_secret(tenant, ref, rules, f"destinations.{kind}.{field}")
    for field, url in block.endpoints():
        scheme = url.partition(":")[0].lower()
        secure = ("https",) if scheme in ("http", "https") else (scheme.rstrip("s") + "s",)
        check_endpoint(f"destinations.{kind}.{field}", url, type(block).documented_hosts,
                       rules, secure=secure)


def check_destinations(tenant: str, destinations: TenantDestinations,
                       rules: DestinationRules) -> None:
    """`check_block` for each of a tenant's blocks (a policy load runs this)."""
    for kind in ("crm", "mail"):
        block = getattr(destinations, kind)
        if block is not None and type(block) not in (CrmDestination, MailDestination):
            check_block(tenant, kind, block, rules)
