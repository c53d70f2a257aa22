"""Pick the options a function takes out of the algorithm's settings (`options_for`), so no function is
handed the whole config section. Looking an entry up by name or import path is `ascent.plugins.resolve`, the
loader every plug-in shares (this package imports only torch)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any


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
