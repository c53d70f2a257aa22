"""The config of data processors (`data.processors`): steps run in order on the loaded training rows before
the prompt sampler sees them (`ascent.data.processors` runs them). Imports without torch.

    data:
      processors:
        - {name: filter, fn: mypkg.rows:is_clean}              # keep rows the predicate accepts
        - {name: transform, fn: mypkg.rows:add_hint}           # row -> row
        - {name: difficulty, column: pass_rate, low: 0.1, high: 0.9}
        - {name: difficulty, store: runs/first, low: 0.1, high: 0.9}   # pass rates from a run's store
        - mypkg.rows:dedupe                                    # rows -> rows, with kwargs

Each built-in is a member of a union switched on `name`, holding only its own settings; a plug-in
(`pkg.module:function`) takes the list of rows and returns the rows to keep.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from ascent.config.choices import Choice, builtin_or_plugin

PROCESSOR_NAME = "Which processor: a built-in name (filter, transform, difficulty) or an import path."
FN = "An import path `pkg.module:function`"


class FilterProcessor(Choice):
    """Keep the rows a predicate plug-in accepts."""

    name: Literal["filter"] = Field("filter", description=PROCESSOR_NAME)
    fn: str = Field(description=f"filter: {FN}, row (a dict) -> bool: keep the row when true.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the plug-in.")


class TransformProcessor(Choice):
    """Rewrite every row with a plug-in."""

    name: Literal["transform"] = Field("transform", description=PROCESSOR_NAME)
    fn: str = Field(description=f"transform: {FN}, row (a dict) -> row (a dict).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the plug-in.")


class DifficultyProcessor(Choice):
    """Keep the rows whose pass rate lies in [low, high]: from a column, or from an earlier run's store."""

    name: Literal["difficulty"] = Field("difficulty", description=PROCESSOR_NAME)
    column: str | None = Field(
        None, description="difficulty: the column that holds each row's pass rate (set this or store)."
    )
    store: str | None = Field(
        None,
        description="difficulty: an earlier run's directory or experience.db on the same data: a row's pass "
        "rate is the share of its trained episodes with reward >= success (rows it never saw are dropped).",
    )
    success: float = Field(1.0, description="difficulty (store): a reward at or above this is a pass.")
    low: float = Field(0.0, ge=0, le=1, description="difficulty: drop rows whose pass rate is below this.")
    high: float = Field(1.0, ge=0, le=1, description="difficulty: drop rows whose pass rate is above this.")

    @model_validator(mode="after")
    def _one_source(self) -> DifficultyProcessor:
        if (self.column is None) == (self.store is None):
            raise ValueError(
                "set exactly one of column (pass rates in the data) and store (an earlier run's)"
            )
        if self.low > self.high:
            raise ValueError(f"low={self.low} is above high={self.high}: every row would be dropped")
        return self


class ProcessorPlugin(Choice):
    """A user's processor, `pkg.module:function`: rows (a list of dicts) -> the rows to keep."""

    name: str = Field(description=PROCESSOR_NAME)
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the plug-in.")


PROCESSOR_CHOICES: dict[str, type[Choice]] = {
    "filter": FilterProcessor,
    "transform": TransformProcessor,
    "difficulty": DifficultyProcessor,
}


_tag = builtin_or_plugin(PROCESSOR_CHOICES, ProcessorPlugin)


ProcessorChoice = Annotated[
    Annotated[FilterProcessor, Tag("FilterProcessor")]
    | Annotated[TransformProcessor, Tag("TransformProcessor")]
    | Annotated[DifficultyProcessor, Tag("DifficultyProcessor")]
    | Annotated[ProcessorPlugin, Tag("ProcessorPlugin")],
    Discriminator(
        _tag,
        custom_error_type="unknown_choice",
        custom_error_message=f"must be one of {', '.join(PROCESSOR_CHOICES)} or an import path "
        "`pkg.module:function`, as a name or as {name: ..., <its settings>}",
    ),
]
