"""Look up a registry entry by name, or load a user's plug-in from an import path `pkg.module:function`."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def resolve(registry: Mapping[str, Callable[..., Any]], name_or_import_path: str) -> Callable[..., Any]:
    """registry, "name" | "pkg.mod:fn" -> the callable. Errors name the value and list the choices."""
    if name_or_import_path in registry:
        return registry[name_or_import_path]
    if ":" not in name_or_import_path:
        choices = ", ".join(sorted(registry))
        raise ValueError(
            f"{name_or_import_path!r} is not a known name; choose one of {choices} "
            "or give an import path `pkg.module:function`."
        )
    module_name, _, attr = name_or_import_path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{name_or_import_path!r}: cannot import module {module_name!r} ({e}).") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{name_or_import_path!r}: module {module_name!r} has no attribute {attr!r}.")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{name_or_import_path!r}: {attr!r} is not callable.")
    return obj
