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
read. Imports without torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from ascent.config.errors import show_value
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
# The flat settings of each choice in the last version before the unions; its resolved config.yaml lists
# every one of them (frozen: a member's newer fields are not in those files).
LEGACY_FLAT: dict[str, tuple[str, ...]] = {
    "policy_loss": (
        "clip_ratio_low",
        "clip_ratio_high",
        "dual_clip_c",
        "gspo_clip_low",
        "gspo_clip_high",
        "cispo_eps_low",
        "cispo_eps_high",
        "sapo_tau_pos",
        "sapo_tau_neg",
    ),
    "advantage": ("scale_by_std", "std_over_batch", "gamma", "lam", "gae_whiten"),
}


class Nested(NamedTuple):
    """What `nest_choices` made of an `algorithm` mapping."""

    data: dict[str, Any]  # each choice as {name: ..., its settings}
    problems: list[str]  # refuse the config (each names the field, the value and the fix)
    warnings: list[str]  # settings of an older resolved config.yaml that were dropped


def nest_choices(algorithm: dict[str, Any], strict: bool = True) -> Nested:
    """The `algorithm` section's mapping with each choice as `{name: ..., its settings}`.

    A flat setting of a member (`clip_ratio_high: 0.28`, the older form) moves into the chosen choice when
    it reads it. One it does not read is a problem (a setting that would do nothing), except one at its
    default when the choice is a built-in; with a plug-in, whose settings are in `algorithm.options`, any
    flat setting is a problem. A section that lists every flat setting of a choice (`LEGACY_FLAT`) is the
    resolved config.yaml of an older version (the one `--resume` asks for): what its choice does not read is
    dropped, with a warning when it mattered. `strict=False` drops it in any section and reports no problem
    (reading the config saved in old checkpoints).
    """
    out = dict(algorithm)
    problems: list[str] = []
    warnings: list[str] = []
    for field, (choices, default) in CHOICE_FIELDS.items():
        lenient = not strict or all(key in out for key in LEGACY_FLAT[field])
        found, dropped = _nest_one(out, field, choices, default, strict, lenient)
        problems += found
        warnings += dropped
    return Nested(out, problems if strict else [], warnings)


def _nest_one(
    data: dict[str, Any],
    field: str,
    choices: dict[str, type[Choice]],
    default: str,
    strict: bool,
    lenient: bool,
) -> tuple[list[str], list[str]]:
    """Nest `data[field]`; (problems, warnings). `lenient`: drop flat settings the choice does not read."""
    raw = data.get(field)
    raw = default if raw is None else raw
    if isinstance(raw, BaseModel):  # a member already (validate_assignment hands over the others as they are)
        if not any(key in data for key in _settings(choices)):
            return [], []
        raw = raw.model_dump()
    choice = {"name": raw} if isinstance(raw, str) else dict(raw) if isinstance(raw, dict) else None
    if choice is None or not isinstance(choice.setdefault("name", default), str):
        return [], []  # not a choice at all: pydantic names the value
    name = choice["name"]
    if name not in choices and ":" not in name and strict:
        return [
            f"algorithm.{field}={name!r}: unknown; use one of {', '.join(sorted(choices))} (or an import "
            "path `pkg.module:function`)."
        ], []
    member = choices.get(name, PluginChoice)
    problems: list[str] = []
    unread: dict[str, Any] = {}
    for key in [k for k in _settings(choices) if k in data]:
        value = data.pop(key)
        if key in member.model_fields:
            problems += _lift(field, choice, key, value)
        elif member is PluginChoice or value != _default(choices, key):
            unread[key] = value  # a plug-in got ascent's value before the unions, so even a default counts
    for key in [k for k in choice if k not in member.model_fields]:
        problems += _stray(field, choice, member, key, choices, strict)
    data[field] = choice
    if lenient:
        return problems, [_dropped(field, name, unread)] if unread else []
    return problems + [_unread(f"algorithm.{k}", field, name, k, v, choices) for k, v in unread.items()], []


def _settings(choices: dict[str, type[Choice]]) -> list[str]:
    """Every setting of any member, in declaration order (each once)."""
    return list(dict.fromkeys(k for m in choices.values() for k in m.model_fields if k != "name"))


def _readers(choices: dict[str, type[Choice]], key: str) -> list[str]:
    """The names of the members that read setting `key`."""
    return [n for n, m in choices.items() if key in m.model_fields and key != "name"]


def _default(choices: dict[str, type[Choice]], key: str) -> Any:
    return choices[_readers(choices, key)[0]].model_fields[key].default


def _lift(field: str, choice: dict[str, Any], key: str, value: Any) -> list[str]:
    """Move the flat `algorithm.<key>` into `choice`, which reads it; the problem when both differ."""
    if key in choice and choice[key] != value:
        return [
            f"algorithm.{key}={show_value(value)} and algorithm.{field}.{key}={show_value(choice[key])}: "
            f"two values for one setting; keep only algorithm.{field}.{key}."
        ]
    choice[key] = value
    return []


def _stray(
    field: str,
    choice: dict[str, Any],
    member: type[Choice],
    key: str,
    choices: dict[str, type[Choice]],
    strict: bool,
) -> list[str]:
    """A nested `algorithm.<field>.<key>` that `member` does not declare: the problem, or dropped."""
    if strict and member is not PluginChoice and not _readers(choices, key):
        return []  # unknown to every member: pydantic reports the unknown key
    value = choice.pop(key)
    if not strict:
        return []
    if member is PluginChoice:
        return [
            f"algorithm.{field}.{key}={show_value(value)}: a plug-in's settings go under algorithm.options; "
            f"move it to algorithm.options.{key}."
        ]
    return [_unread(f"algorithm.{field}.{key}", field, choice["name"], key, value, choices)]


def _who(readers: list[str]) -> str:
    return readers[0] if len(readers) == 1 else f"{', '.join(readers[:-1])} or {readers[-1]}"


def _unread(where: str, field: str, name: str, key: str, value: Any, choices: dict[str, type[Choice]]) -> str:
    """`algorithm.gspo_clip_low=0.001: only policy_loss=gspo reads it, and this run's policy_loss is ppo;
    ...`"""
    readers = _readers(choices, key)
    head = f"{where}={show_value(value)}: only {field}={_who(readers)} reads it, and this run's {field} is"
    if ":" in name:
        return (
            f"{head} the plug-in {name!r}, whose settings go under algorithm.options; remove it or move it "
            f"to algorithm.options.{key}."
        )
    return f"{head} {name}; remove it or set {field}: {{name: {readers[0]}, {key}: {show_value(value)}}}."


def _dropped(field: str, name: str, unread: dict[str, Any]) -> str:
    """The warning for the flat settings of an older resolved config that `field`'s choice does not read."""
    listed = ", ".join(f"{key}={show_value(value)}" for key, value in unread.items())
    head = f"algorithm: ignoring {listed} (an older version's config.yaml, which lists every setting flat)"
    if ":" in name:
        return (
            f"{head}: this run's {field} is the plug-in {name!r}, which takes its settings from "
            "algorithm.options only; set algorithm.options.<key> for each it should get."
        )
    return (
        f"{head}: this run's {field} is {name}, which does not read {'it' if len(unread) == 1 else 'them'}."
    )


def misplaced_options(algorithm: dict[str, Any], shared: Iterable[str]) -> list[str]:
    """Problems for keys of `algorithm.options` (a plug-in's own settings) that name one of ascent's settings:
    a field of the section (`shared`) or a setting of a built-in member whose field has a built-in chosen
    (it would override the choice's own value, or reach a function it was not meant for). A setting of a
    member is a plug-in's when its field's choice is that plug-in. `algorithm`: nested (`nest_choices`)."""
    options = algorithm.get("options")
    if not isinstance(options, dict):
        return []
    shared = set(shared)
    problems = []
    for key, value in options.items():
        where = f"algorithm.options.{key}={show_value(value)}"
        if key in shared:
            problems.append(f"{where}: a setting of algorithm itself; set algorithm.{key} instead.")
            continue
        for field, (choices, default) in CHOICE_FIELDS.items():
            name = name_of(algorithm.get(field)) or default
            readers = _readers(choices, str(key))
            if not readers or name not in choices:  # none reads it, or a plug-in (or unknown) is chosen
                continue
            if name in readers:
                problems.append(f"{where}: a setting of {field}={name}; set algorithm.{field}.{key} instead.")
            else:
                problems.append(
                    f"{where}: a setting of {field}={_who(readers)}, and this run's {field} is {name}; "
                    "algorithm.options holds a plug-in's own settings, under names no built-in setting uses: "
                    f"remove it, or set {field}: {{name: {readers[0]}, {key}: {show_value(value)}}}."
                )
    return problems
