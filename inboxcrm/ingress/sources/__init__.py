"""The registry of inbound sources: one module here per name of `schemas.sources`
(`<name>.py`, exporting its source class as `SOURCE`), found by that name. The relay serves
every push source's paths with the one route of `base.receive`; nothing else lists them."""

from __future__ import annotations

import importlib
from typing import Any

from fastapi import APIRouter

from inboxcrm.ingress.sources.base import PushSource
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.sources import SOURCE_NAMES


def source_class(name: str) -> type[PushSource[Any, Any]]:
    """The class the module of source `name` exports as `SOURCE`."""
    module = importlib.import_module(f"{__name__}.{name}")
    cls = getattr(module, "SOURCE", None)
    if not (isinstance(cls, type) and issubclass(cls, PushSource)) or cls.name != name:
        raise TypeError(f"{module.__name__}.SOURCE is not the PushSource named {name!r}")
    return cls


def push_sources(settings: Settings) -> list[PushSource[Any, Any]]:
    """Every registered push source, built from the settings (each logs at start when its
    credential is missing or bound to no tenant)."""
    return [source_class(name)(settings) for name in SOURCE_NAMES]


def sources_router(settings: Settings) -> APIRouter:
    """`POST` at each path of each push source."""
    router = APIRouter()
    for source in push_sources(settings):
        for path in source.paths:
            router.add_api_route(path, source.endpoint, methods=["POST"],
                                 name=f"inbound_{source.name}")
    return router
