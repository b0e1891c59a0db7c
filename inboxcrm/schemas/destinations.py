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
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from functools import cache
from typing import Any, ClassVar, Union, get_args, get_origin

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
    provider: str

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
