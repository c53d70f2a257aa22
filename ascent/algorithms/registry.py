"""Look up a registry entry by name, or load a user's plug-in from an import path `pkg.module:function`; pick
the options a function takes out of the algorithm's settings (`options_for`), so no function is handed the
whole config section."""

from __future__ import annotations

import importlib
import inspect
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


def option_names(fn: Callable[..., Any]) -> set[str] | None:
    """The options `fn` takes: its parameters with a default or keyword-only (the tensors it is called with
    have neither). None when it takes `**kwargs`: such a plug-in is handed every option."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {
        p.name
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY
        or (p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.default is not inspect.Parameter.empty)
    }


def options_for(fn: Callable[..., Any], available: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `available` (algorithm settings by name) that `fn` takes, by `option_names`."""
    names = option_names(fn)
    return dict(available) if names is None else {k: v for k, v in available.items() if k in names}
