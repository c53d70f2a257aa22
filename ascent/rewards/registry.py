"""The reward registry: built-in names and `pkg.module:function` import paths -> reward functions.

`REWARD_FUNCTIONS` is the plain dict of built-ins; `resolve_reward_fn` turns a `reward.fn` value (or a row's
`reward_fn` field) into a callable, and `check_reward_signature` verifies a function accepts the reward
arguments and the configured kwargs before any sample is scored.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ascent.errors import AscentError
from ascent.plugins import PluginError, load_plugin
from ascent.rewards.builtin import exact_match, format_reward, gsm8k, numeric_match
from ascent.rewards.mathverify import math_verify_reward

RewardFn = Callable[..., Any]


class RewardConfigError(AscentError, ValueError):
    """A reward function that cannot be found or called as configured; the message names the setting and
    fix."""


REWARD_FUNCTIONS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "numeric_match": numeric_match,
    "math_verify": math_verify_reward,
    "gsm8k": gsm8k,
    "format": format_reward,
}


def resolve_reward_fn(spec: str, field: str = "reward.fn") -> RewardFn:
    """A built-in name or `pkg.module:function` -> the callable; `field` names the setting in errors."""
    if not isinstance(spec, str) or not spec.strip():
        raise RewardConfigError(
            f"{field}={spec!r}: name a built-in ({', '.join(REWARD_FUNCTIONS)}) or pkg.module:function."
        )
    spec = spec.strip()
    if spec in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[spec]
    if ":" not in spec:
        raise RewardConfigError(
            f"{field}={spec}: not a built-in reward ({', '.join(REWARD_FUNCTIONS)}); "
            "for your own function use an import path `pkg.module:function`."
        )
    try:
        return load_plugin(spec, field)  # type: ignore[no-any-return]
    except PluginError as err:
        raise RewardConfigError(str(err)) from err


def check_reward_signature(fn: RewardFn, kwargs: dict[str, Any], label: str) -> None:
    """Raise RewardConfigError unless fn(prompt, response, response_ids, metadata, **kwargs) binds."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some C callables hide their signature; they will be checked when called
    try:
        signature.bind("prompt", "response", [], {}, **kwargs)
    except TypeError as err:
        raise RewardConfigError(
            f"{label}: cannot be called as fn(prompt, response, response_ids, metadata, **reward.kwargs) "
            f"with kwargs {sorted(kwargs)} ({err}); fix its signature (add **kwargs) or reward.kwargs."
        ) from err
