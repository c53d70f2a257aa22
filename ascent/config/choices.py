"""The algorithm's choices that carry their own settings: one config model per built-in policy loss and
advantage estimator, switched on `name` (design: "a config union switched on its name, each member holding
only its own fields"). `AlgorithmConfig.policy_loss` and `.advantage` hold one of these.

    algorithm:
      policy_loss: gspo                          # a name: that member with its defaults
      advantage: {name: gae, lam: 0.95}          # a mapping: the name and the member's own fields

A member's field names equal the keyword parameters of its registry function in `ascent.algorithms`, so
`options_for` hands each function its own settings. A plug-in (`pkg.module:function`) is `PluginChoice`;
its settings go under `algorithm.options`, which only plug-ins get and which may not name one of ascent's
own settings (`misplaced_options`). `nest_choices` turns the flat form of older configs
(`algorithm.clip_ratio_high: 0.28`) into the nested one and names every setting the chosen choice does not
read (`ascent.config.nesting`). Imports without torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from ascent.config.section import Section

NAME = "Which one: a built-in name, or an import path `pkg.module:function` (settings: algorithm.options)."


class Choice(Section):
    """A member of a choice union. A bare name (`"gspo"`) validates as that member with its defaults."""

    name: str = Field(description=NAME)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class PluginChoice(Choice):
    name: str = Field(description=NAME)


# Policy losses (ascent.algorithms.policy_losses).
class PpoLoss(Choice):
    name: Literal["ppo"] = Field("ppo", description=NAME)
    clip_ratio_low: float = Field(0.2, gt=0, description="PPO: lower clip, ratio >= 1 - clip_ratio_low.")
    clip_ratio_high: float = Field(0.2, gt=0, description="PPO: upper clip, ratio <= 1 + clip_ratio_high.")
    dual_clip_c: float | None = Field(None, gt=1, description="Dual-clip constant for negative advantages.")


class GspoLoss(Choice):
    name: Literal["gspo"] = Field("gspo", description=NAME)
    gspo_clip_low: float = Field(3e-4, gt=0, description="GSPO: sequence ratio >= 1 - gspo_clip_low.")
    gspo_clip_high: float = Field(4e-4, gt=0, description="GSPO: sequence ratio <= 1 + gspo_clip_high.")


class CispoLoss(Choice):
    name: Literal["cispo"] = Field("cispo", description=NAME)
    cispo_eps_low: float = Field(
        1.0, gt=0, le=1, description="CISPO: IS weight >= 1 - eps_low (1: no bound)."
    )
    cispo_eps_high: float = Field(0.28, gt=0, description="CISPO: IS weight <= 1 + cispo_eps_high.")


class SapoLoss(Choice):
    name: Literal["sapo"] = Field("sapo", description=NAME)
    sapo_tau_pos: float = Field(1.0, gt=0, description="SAPO: gate temperature for positive advantages.")
    sapo_tau_neg: float = Field(1.05, gt=0, description="SAPO: gate temperature for negative advantages.")


class ReinforceLoss(Choice):
    name: Literal["reinforce"] = Field("reinforce", description=NAME)


class GmpoLoss(Choice):
    name: Literal["gmpo"] = Field("gmpo", description=NAME)
    gmpo_clip_low: float = Field(
        0.4, gt=0, description="GMPO: token log-ratio >= -gmpo_clip_low (paper: 0.4, i.e. ratio >= e^-0.4)."
    )
    gmpo_clip_high: float = Field(
        0.4, gt=0, description="GMPO: token log-ratio <= gmpo_clip_high (paper: 0.4, i.e. ratio <= e^0.4)."
    )


class DroLoss(Choice):
    name: Literal["dro"] = Field("dro", description=NAME)
    dro_beta: float = Field(
        0.05, ge=0, description="DRO: weight of the quadratic penalty 1/2 (logp - old)^2 (Tinker shows 0.05)."
    )


class ClipCovLoss(Choice):
    name: Literal["clip_cov"] = Field("clip_cov", description=NAME)
    clip_ratio_low: float = Field(0.2, gt=0, description="PPO: lower clip, ratio >= 1 - clip_ratio_low.")
    clip_ratio_high: float = Field(0.2, gt=0, description="PPO: upper clip, ratio <= 1 + clip_ratio_high.")
    clip_cov_ratio: float = Field(
        2e-4, gt=0, le=1, description="Clip-Cov: share of tokens whose gradient is cut (paper: 2e-4)."
    )
    clip_cov_lb: float = Field(
        1.0, description="Clip-Cov: cut only tokens with covariance > this (paper: 1)."
    )
    clip_cov_ub: float = Field(
        5.0, description="Clip-Cov: cut only tokens with covariance < this (paper: 5)."
    )

    @model_validator(mode="after")
    def _band(self) -> ClipCovLoss:
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(
                f"clip_cov_lb={self.clip_cov_lb} must be below clip_cov_ub={self.clip_cov_ub} (no token's "
                "covariance can fall between them); the paper uses 1 and 5."
            )
        return self


class KlCovLoss(Choice):
    name: Literal["kl_cov"] = Field("kl_cov", description=NAME)
    kl_cov_ratio: float = Field(
        2e-3, gt=0, le=1, description="KL-Cov: share of tokens penalised (paper: 2e-3 at 7B, 2e-4 at 32B)."
    )
    kl_cov_coef: float = Field(
        1.0, ge=0, description="KL-Cov: weight of |logp - old| on the penalised tokens (paper: 1)."
    )


# Advantage estimators (ascent.algorithms.advantages, .returns); adv_eps is shared, so it stays flat.
class GrpoAdvantage(Choice):
    name: Literal["grpo"] = Field("grpo", description=NAME)
    scale_by_std: bool = Field(True, description="GRPO: divide by the group std (False is Dr. GRPO).")
    std_over_batch: bool = Field(False, description="GRPO: use the batch std instead of the group std.")


SHIFT_MEAN = "Whitening keeps the mean at 0; false adds the mean back (scaled, not centred; TRL, verl)."


class GaeAdvantage(Choice):
    name: Literal["gae"] = Field("gae", description=NAME)
    gamma: float = Field(1.0, ge=0, le=1, description="Discount for GAE / REINFORCE++ returns.")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    gae_whiten: bool = Field(True, description="GAE: whiten advantages over the batch's policy tokens.")
    shift_mean: bool = Field(True, description=SHIFT_MEAN)


class ReinforcePPAdvantage(Choice):
    name: Literal["reinforce_pp", "reinforce_pp_baseline"] = Field(description=NAME)
    gamma: float = Field(1.0, ge=0, le=1, description="Discount for GAE / REINFORCE++ returns.")
    shift_mean: bool = Field(True, description=SHIFT_MEAN)


class RemaxAdvantage(Choice):
    name: Literal["remax"] = Field("remax", description=NAME)
    gamma: float = Field(1.0, ge=0, le=1, description="Discount for GAE / REINFORCE++ returns.")


class GroupAdvantage(Choice):
    name: Literal["rloo", "opo"] = Field(description=NAME)


class GpgAdvantage(Choice):
    name: Literal["gpg"] = Field("gpg", description=NAME)
    gpg_alpha: bool = Field(
        True, description="GPG: scale by B / (B - M), M = trajectories of groups without reward spread."
    )


class GrpoPasskAdvantage(Choice):
    name: Literal["grpo_passk"] = Field("grpo_passk", description=NAME)
    scale_by_std: bool = Field(True, description="GRPO: divide by the group std (False is Dr. GRPO).")


class PasskAdvantage(Choice):
    name: Literal["passk"] = Field("passk", description=NAME)
    pass_k: int = Field(
        4,
        ge=1,
        description="Pass@k: the k of the objective (capped at the group size; k = 1 is GRPO on 0/1 rewards).",
    )


class DistillAdvantage(Choice):
    name: Literal["distill"] = Field("distill", description=NAME)
    distill_coef: float = Field(
        1.0,
        ge=0,
        description="Distillation (teacher: algorithm.teacher): A_t = distill_coef * (teacher_logp_t - "
        "sampler_logp_t) + reward_weight * A_grpo.",
    )
    reward_weight: float = Field(
        0.0,
        ge=0,
        description="Distillation: weight of the GRPO outcome advantage added to every token (0: pure "
        "distillation, the rewards are not used).",
    )


class OtbAdvantage(Choice):
    name: Literal["optimal_token_baseline"] = Field("optimal_token_baseline", description=NAME)
    otb_zero_tail: bool = Field(
        False,
        description="Optimal-token baseline: a group's strictly longest sample gets baseline 0 past the second "
        "longest (verl's handle_zero_tail).",
    )


POLICY_LOSS_CHOICES: dict[str, type[Choice]] = {
    "ppo": PpoLoss,
    "gspo": GspoLoss,
    "cispo": CispoLoss,
    "sapo": SapoLoss,
    "reinforce": ReinforceLoss,
    "gmpo": GmpoLoss,
    "dro": DroLoss,
    "clip_cov": ClipCovLoss,
    "kl_cov": KlCovLoss,
}
ADVANTAGE_CHOICES: dict[str, type[Choice]] = {
    "grpo": GrpoAdvantage,
    "rloo": GroupAdvantage,
    "opo": GroupAdvantage,
    "gpg": GpgAdvantage,
    "grpo_passk": GrpoPasskAdvantage,
    "passk": PasskAdvantage,
    "reinforce_pp": ReinforcePPAdvantage,
    "reinforce_pp_baseline": ReinforcePPAdvantage,
    "remax": RemaxAdvantage,
    "gae": GaeAdvantage,
    "distill": DistillAdvantage,
    "optimal_token_baseline": OtbAdvantage,
}


def name_of(value: object) -> str | None:
    """The choice name in a bare name, a mapping or a member (None when there is none)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return value.get("name")
    return getattr(value, "name", None)


def builtin_or_plugin(
    choices: dict[str, type[Choice]], plugin: type[Choice]
) -> Callable[[object], str | None]:
    """The discriminator of a list item that is a built-in choice (a name of `choices`) or a plug-in (an import
    path `pkg.module:function`, validated as `plugin`): the tag is the member class's name, None when neither."""

    def tag(value: object) -> str | None:
        name = name_of(value)
        if not isinstance(name, str):
            return None
        if name in choices:
            return choices[name].__name__
        return plugin.__name__ if ":" in name else None

    return tag


def _discriminator(choices: dict[str, type[Choice]]) -> Discriminator:
    """Pick a union member by the value's name: a built-in's member, PluginChoice for an import path."""

    def tag(value: Any) -> str | None:
        name = name_of(value)
        if not isinstance(name, str):
            return None
        if name in choices:
            return choices[name].__name__
        return PluginChoice.__name__ if ":" in name else None

    return Discriminator(
        tag,
        custom_error_type="unknown_choice",
        custom_error_message=f"must be one of {', '.join(choices)} or an import path `pkg.module:function`, "
        "as a name or as {name: ..., <its settings>}",
    )


# Each member is tagged with its class name (`ascent.config.fields.choice_members` reads the tags).
PolicyLossChoice = Annotated[
    Annotated[PpoLoss, Tag("PpoLoss")]
    | Annotated[GspoLoss, Tag("GspoLoss")]
    | Annotated[CispoLoss, Tag("CispoLoss")]
    | Annotated[SapoLoss, Tag("SapoLoss")]
    | Annotated[ReinforceLoss, Tag("ReinforceLoss")]
    | Annotated[GmpoLoss, Tag("GmpoLoss")]
    | Annotated[DroLoss, Tag("DroLoss")]
    | Annotated[ClipCovLoss, Tag("ClipCovLoss")]
    | Annotated[KlCovLoss, Tag("KlCovLoss")]
    | Annotated[PluginChoice, Tag("PluginChoice")],
    _discriminator(POLICY_LOSS_CHOICES),
]
AdvantageChoice = Annotated[
    Annotated[GrpoAdvantage, Tag("GrpoAdvantage")]
    | Annotated[GroupAdvantage, Tag("GroupAdvantage")]
    | Annotated[GpgAdvantage, Tag("GpgAdvantage")]
    | Annotated[GrpoPasskAdvantage, Tag("GrpoPasskAdvantage")]
    | Annotated[PasskAdvantage, Tag("PasskAdvantage")]
    | Annotated[ReinforcePPAdvantage, Tag("ReinforcePPAdvantage")]
    | Annotated[RemaxAdvantage, Tag("RemaxAdvantage")]
    | Annotated[GaeAdvantage, Tag("GaeAdvantage")]
    | Annotated[DistillAdvantage, Tag("DistillAdvantage")]
    | Annotated[OtbAdvantage, Tag("OtbAdvantage")]
    | Annotated[PluginChoice, Tag("PluginChoice")],
    _discriminator(ADVANTAGE_CHOICES),
]
# field -> (its members by name, the default name)
CHOICE_FIELDS: dict[str, tuple[dict[str, type[Choice]], str]] = {
    "policy_loss": (POLICY_LOSS_CHOICES, "ppo"),
    "advantage": (ADVANTAGE_CHOICES, "grpo"),
}
