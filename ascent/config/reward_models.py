"""The config of scored rewards beyond a function: a sequence-classification reward model
(`reward.model`) and a generative judge (`reward.judge`); either, both or none (`ascent.rewards.judge` and
`ascent.orchestrator.reward_models` consume them). Imports without torch.

    reward:
      fn: exact_match            # weighted by reward.fn_weight (0: the function is not called)
      model: {path: /ckpt/rm, weight: 1.0}
      judge: {model: policy, template: "Q: {prompt}\\nA: {response}\\nScore 0-10:", parser: score_0_10}

An episode's reward is `fn_weight * fn + model.weight * model + judge.weight * judge`; each term is also
recorded as its own reward component (`fn`, `reward_model`, `judge`) and metric (`reward/fn/mean`, ...).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from ascent.config.section import Section

if TYPE_CHECKING:
    from ascent.config.schema import RunConfig

PIN_PREFIX = "policy@"  # reward.judge.model=policy@N: this run's policy pinned at version N
JUDGE_PARSERS = ("score_0_10", "yes_no")  # ascent.rewards.judge.JUDGE_PARSERS (config imports no rewards)

Dtype = Literal["bf16", "fp16", "fp32"]


class RewardModelConfig(Section):
    """A sequence-classification reward model (one scalar logit), scored in its own worker group."""

    path: str = Field(
        description="Local directory of a Hugging Face sequence-classification checkpoint with num_labels=1 "
        "(e.g. Qwen2ForSequenceClassification) and its tokenizer."
    )
    weight: float = Field(1.0, description="Weight of the reward model's score in the episode's reward.")
    dtype: Dtype = Field("fp32", description="Compute dtype of the reward model: bf16, fp16 or fp32.")
    max_tokens_per_batch: int = Field(
        8192,
        gt=0,
        description="Token budget of one packed forward of the reward model (sequences are never split).",
    )
    chat_template: bool = Field(
        True,
        description="Format prompt and response as a user and an assistant message with the reward model's "
        "chat template (true), or as the prompt text followed by the response text (false).",
    )


class JudgeConfig(Section):
    """An LLM-as-judge: a prompt template, a parser of its reply, and the model that writes the reply."""

    model: str = Field(
        "policy",
        description="`policy`: the rollout replicas judge with the weights they hold now (not pinned: they "
        "change with every update). `policy@N` (N >= 0): a judge engine of its own holding this run's policy "
        "at version N (the weights after iteration N; policy@0: model.path), never updated after: it starts "
        "from model.path, so iterations 1..N judge with the initial weights (version N does not exist yet, "
        "and a judge that never moves is what pinning asks for), and from iteration N+1 on with version N, "
        "also kept in <run_dir>/judge/v<N>/ (outside checkpoint rotation) for a resumed run. A directory: "
        "a judge engine of its own loaded from that checkpoint, never updated.",
    )
    engine: Literal["reference", "fast"] = Field(
        "reference",
        description="The engine of a judge of its own (`policy@N` or a checkpoint directory): `reference` "
        "(transformers, any device) or `fast` (the paged-KV engine with CUDA graphs on a GPU; eager on CPU). "
        "With `policy` the rollout replicas judge, on rollout.engine.",
    )
    gpu_memory_fraction: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="With reward.judge.engine=fast: the share of its GPU the judge engine takes for weights "
        "and KV cache (beside what the policy's replicas take when they share the GPU).",
    )
    template: str = Field(
        description="The judge's user message; {prompt}, {response} and {answer} (the row's `answer` field, "
        "empty when it has none) are filled in. Rendered with the judge tokenizer's chat template."
    )
    parser: str = Field(
        "score_0_10",
        description="How the reply becomes a score: `score_0_10` (the last number 0..10, divided by 10), "
        "`yes_no` (1 for yes, 0 for no), or a regular expression whose first group is the score.",
    )
    weight: float = Field(1.0, description="Weight of the judge's score in the episode's reward.")
    temperature: float = Field(0.0, ge=0, description="The judge's sampling temperature (0: greedy).")
    max_new_tokens: int = Field(32, gt=0, description="The longest judge reply in tokens.")
    timeout_s: float | None = Field(
        60.0,
        gt=0,
        description="Wall-clock budget of one judgement, from when the engine takes it: a reply still being "
        "written then is cut, and that sample's judge score is 0.0 and counts as a failure (logged, "
        "against reward.max_failure_rate), like a failed reward function. null: no budget.",
    )
    cache_size: int = Field(
        100_000,
        ge=0,
        description="Judgements kept, keyed by a hash of the prompt, response and answer: a repeated one "
        "is not asked again (0: no cache).",
    )

    @property
    def pinned_version(self) -> int | None:
        """N of `policy@N`; None for `policy` and for a checkpoint directory."""
        return pinned_policy_version(self.model)

    @field_validator("model")
    @classmethod
    def _pin_spelling(cls, model: str) -> str:
        pinned_policy_version(model)  # raises on a bad N
        return model

    @model_validator(mode="after")
    def _engine_of_its_own(self) -> JudgeConfig:
        if self.engine == "fast" and self.model == "policy":
            raise ValueError(
                "reward.judge.engine='fast' with reward.judge.model='policy': the rollout replicas judge, on "
                "rollout.engine; drop reward.judge.engine, or give the judge an engine of its own (policy@N or "
                "a checkpoint directory)."
            )
        return self

    @field_validator("template")
    @classmethod
    def _shows_response(cls, template: str) -> str:
        if "{response}" not in template:
            raise ValueError(
                f"reward.judge.template={template[:60]!r} never shows the response; put {{response}} (and "
                "{prompt}, {answer} as needed) in it."
            )
        return template

    @field_validator("parser")
    @classmethod
    def _known_or_regex(cls, parser: str) -> str:
        if parser not in JUDGE_PARSERS:
            try:
                re.compile(parser)
            except re.error as err:
                raise ValueError(
                    f"reward.judge.parser={parser!r} is neither a built-in ({', '.join(JUDGE_PARSERS)}) nor a "
                    f"regular expression ({err}); fix the pattern or name a built-in."
                ) from None
        return parser


def pinned_policy_version(model: str) -> int | None:
    """N of `reward.judge.model=policy@N` (a whole number >= 0); None when `model` does not start with
    `policy@`. A bad N is a ValueError saying the fix (the config loader prefixes the field and value)."""
    if not model.startswith(PIN_PREFIX):
        return None
    n = model.removeprefix(PIN_PREFIX)
    if not (n.isascii() and n.isdigit()):
        raise ValueError(
            f"the version after {PIN_PREFIX!r} must be a whole number >= 0 (a policy version: the weights "
            f"after that iteration), e.g. {PIN_PREFIX}0 for model.path or "
            f"{PIN_PREFIX}10; write `policy` for the moving policy, or a checkpoint directory."
        )
    return int(n)


class RewardModelsMixin(Section):
    """The `reward` section's fields for reward models and judges (mixed into `RewardConfig`)."""

    fn_weight: float = Field(
        1.0,
        description="Weight of `fn`'s score in the episode's reward when reward.model or reward.judge is "
        "set; 0 skips the function.",
    )
    model: RewardModelConfig | None = Field(
        None, description="A sequence-classification reward model (see ascent.config.reward_models)."
    )
    judge: JudgeConfig | None = Field(None, description="An LLM-as-judge (see ascent.config.reward_models).")


def reward_model_rules(cfg: RunConfig) -> list[str]:
    """reward.model and reward.judge score single-turn episodes: an env or agent source rewards its own."""
    r = cfg.reward
    used = [name for name, value in (("model", r.model), ("judge", r.judge)) if value is not None]
    pin = r.judge.pinned_version if r.judge is not None else None
    problems = []
    if pin is not None and pin >= cfg.iterations:
        problems.append(
            f"reward.judge.model=policy@{pin}: version {pin} is published after iteration {pin}, and the run "
            f"has iterations={cfg.iterations}, so no episode would be judged with it; pin a version below "
            f"{cfg.iterations} (policy@0: the initial weights) or raise iterations."
        )
    if cfg.rollout.source.name == "prompt":
        return problems
    return problems + [
        f"reward.{name} is set, but rollout.source={cfg.rollout.source.name} rewards its own episodes; "
        "reward models and judges score single-turn prompts (rollout.source=prompt): remove it."
        for name in used
    ]
