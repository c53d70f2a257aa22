"""The config of group hooks (`reward.group_hooks`): shaping and filters that see a whole group, run by the
collector on every scored batch (`ascent.rewards.group_hooks` has the built-ins and the protocol).

    reward:
      group_hooks:
        - curiosity                                      # a built-in with its defaults
        - {name: difficulty_filter, low: 0.1, high: 0.9}  # a built-in and its own settings
        - {name: mypkg.hooks:shorter, kwargs: {scale: 2}} # a plug-in and its keyword arguments

Each built-in is a member of a union switched on `name`, holding only its own settings (validated here, so
a typo or a value out of range names the entry and the setting); a plug-in (`pkg.module:function`) gets
`kwargs`. Imports without torch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from ascent.config.choices import Choice, builtin_or_plugin

HOOK_NAME = "Which hook: a built-in name (curiosity, length_penalty, difficulty_filter) or an import path."


class CuriosityHook(Choice):
    """Pixel-Reasoner's curiosity bonus and call penalty (defaults: the paper's settings, as we recall
    them)."""

    name: Literal["curiosity"] = Field("curiosity", description=HOOK_NAME)
    target_rate: float = Field(
        0.3, ge=0, le=1, description="curiosity: the group tool-use rate below which tool use earns a bonus."
    )
    alpha: float = Field(
        0.5, ge=0, description="curiosity: bonus = alpha * (target_rate - rate), for episodes calling a tool."
    )
    beta: float = Field(0.05, ge=0, description="curiosity: penalty per tool call beyond max_calls.")
    max_calls: int = Field(1, ge=0, description="curiosity: tool calls an episode makes without penalty.")


class LengthPenaltyHook(Choice):
    """Kimi k1.5's group-relative length reward."""

    name: Literal["length_penalty"] = Field("length_penalty", description=HOOK_NAME)
    coef: float = Field(1.0, ge=0, description="length_penalty: weight of the length reward (0.5 .. -0.5).")
    correct_at: float = Field(
        1.0, description="length_penalty: a reward at or above this counts as correct (keeps the bonus)."
    )


class DifficultyFilter(Choice):
    """Drop the groups whose mean reward lies outside [low, high]."""

    name: Literal["difficulty_filter"] = Field("difficulty_filter", description=HOOK_NAME)
    low: float = Field(description="difficulty_filter: drop groups whose mean reward is below this.")
    high: float = Field(description="difficulty_filter: drop groups whose mean reward is above this.")

    @model_validator(mode="after")
    def _ordered(self) -> DifficultyFilter:
        if self.low > self.high:
            raise ValueError(
                f"low={self.low} is above high={self.high}: every group would be dropped; set low <= high"
            )
        return self


class GroupHookPlugin(Choice):
    """A user's hook, `pkg.module:function`, called with `kwargs`."""

    name: str = Field(description=HOOK_NAME)
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="A plug-in hook's keyword arguments (its own settings)."
    )


GROUP_HOOK_CHOICES: dict[str, type[Choice]] = {
    "curiosity": CuriosityHook,
    "length_penalty": LengthPenaltyHook,
    "difficulty_filter": DifficultyFilter,
}


_tag = builtin_or_plugin(GROUP_HOOK_CHOICES, GroupHookPlugin)


GroupHookChoice = Annotated[
    Annotated[CuriosityHook, Tag("CuriosityHook")]
    | Annotated[LengthPenaltyHook, Tag("LengthPenaltyHook")]
    | Annotated[DifficultyFilter, Tag("DifficultyFilter")]
    | Annotated[GroupHookPlugin, Tag("GroupHookPlugin")],
    Discriminator(
        _tag,
        custom_error_type="unknown_choice",
        custom_error_message=f"must be one of {', '.join(GROUP_HOOK_CHOICES)} or an import path "
        "`pkg.module:function`, as a name or as {name: ..., <its settings>}",
    ),
]
