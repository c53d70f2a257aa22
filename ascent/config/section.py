"""The base of every config section (its own module so that section files can share it without cycles)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated, and a float field
    takes finite numbers only (`train.lr=inf` or `nan` would train nothing; a field where infinity means
    "no bound" says so with `Field(allow_inf_nan=True)`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
