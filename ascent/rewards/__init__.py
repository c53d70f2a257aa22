"""Rewards: built-in reward functions, the name/import-path registry, and the runner that scores batches.

A reward function has the signature

    fn(prompt: str, response: str, response_ids: list[int], metadata: dict, **kwargs) -> float | dict

- `prompt`: the rendered prompt text; `response`: the decoded response; `response_ids`: its token ids.
- `metadata`: the dataset row's fields besides the prompt, e.g. `metadata["answer"]`,
  `metadata["data_source"]`.
- `**kwargs`: `reward.kwargs` from the config, passed to every call (built-ins ignore keys they do not use).
- Return a float, or a dict `{"reward": float, "<name>": float, ...}` whose extra entries are logged as
  metrics `reward/<name>` (batch means). Exceptions, non-numbers and NaN/inf count as failures.

Pick one with `reward.fn`: a built-in name from `REWARD_FUNCTIONS` (exact_match, numeric_match, math_verify,
gsm8k, format) or an import path `pkg.module:function`. A row's `reward_fn` field overrides it for that row.
"""

from ascent.rewards.builtin import exact_match, format_reward, gsm8k, numeric_match
from ascent.rewards.mathverify import math_verify_reward
from ascent.rewards.registry import (
    REWARD_FUNCTIONS,
    RewardConfigError,
    RewardFn,
    check_reward_signature,
    resolve_reward_fn,
)
from ascent.rewards.runner import RewardFailureError, RewardInput, RewardResult, RewardRunner, to_reward

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardConfigError",
    "RewardFailureError",
    "RewardFn",
    "RewardInput",
    "RewardResult",
    "RewardRunner",
    "check_reward_signature",
    "exact_match",
    "format_reward",
    "gsm8k",
    "math_verify_reward",
    "numeric_match",
    "resolve_reward_fn",
    "to_reward",
]
