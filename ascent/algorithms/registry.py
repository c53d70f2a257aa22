"""Look up a registry entry by name, or load a user's plug-in from an import path `pkg.module:function`; pick
the options a function takes out of the algorithm's settings (`options_for`), so no function is handed the
whole config section. Import paths go through `ascent.plugins`, the loader every plug-in shares."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ascent.plugins import IMPORT_PATH_FORM, PluginError, load_plugin


def resolve(
    registry: Mapping[str, Callable[..., Any]], name_or_import_path: str, field: str = "algorithm"
) -> Callable[..., Any]:
    """registry, "name" | "pkg.mod:fn" -> the callable; `field` names the setting in errors (a ValueError that
    names the value and the fix: the registry's names, or where an import path was looked for)."""
    if name_or_import_path in registry:
        return registry[name_or_import_path]
    if ":" not in name_or_import_path:
        choices = ", ".join(sorted(registry))
        raise PluginError(
            f"{field}={name_or_import_path!r}: not a known name; choose one of {choices} "
            f"or give an import path `{IMPORT_PATH_FORM}` to your own function."
        )
    fn: Callable[..., Any] = load_plugin(name_or_import_path, field)
    return fn


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
