"""`ascent eval`: score a checkpoint on a prompt dataset (accuracy, mean reward, pass@k), an environment's
episodes, or an agent's. `ascent.cli` registers `evaluate` as the command; the work is in
`ascent.entrypoints.evaluate` (imported when the command runs: it needs torch).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ascent.entrypoints.guard import ErrorGuard
from ascent.errors import AscentError

ModelOpt = Annotated[str, typer.Option("--model", help="Checkpoint directory (Hugging Face format).")]
DataOpt = Annotated[str, typer.Option("--data", help="Prompts: a .jsonl or .parquet file.")]
RewardOpt = Annotated[str, typer.Option(help="Reward function name or pkg.module:function.")]
MaxNewTokensOpt = Annotated[int, typer.Option(min=1, help="Most tokens generated per response.")]
TemperatureOpt = Annotated[float, typer.Option(min=0.0, help="Sampling temperature; 0 is greedy.")]
SamplesOpt = Annotated[int, typer.Option(min=1, help="Responses per prompt.")]
PassKOpt = Annotated[
    str,
    typer.Option(
        help="Report pass@k and mean@k for these k, comma-separated (e.g. 1,4,8; each at most --samples)."
    ),
]
OutOpt = Annotated[str | None, typer.Option(help="Write every response and its reward to this JSONL file.")]
MaxPromptsOpt = Annotated[int | None, typer.Option(min=1, help="Evaluate only the first N prompts.")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
EngineOpt = Annotated[
    str,
    typer.Option(help="Rollout engine: reference (transformers, any device) or fast (the GPU engine)."),
]
DtypeOpt = Annotated[str, typer.Option(help="fp32, bf16 or fp16: the dtype you train and sample with.")]
RewardTimeoutSOpt = Annotated[
    float | None,
    typer.Option(
        min=0.001,
        help="Seconds one reward call may take (it then scores 0); default 30, or --reward-config's "
        "reward.timeout_s.",
    ),
]
RewardConfigOpt = Annotated[
    str | None,
    typer.Option(
        help="A YAML whose `reward` section (a train config works) scores instead of --reward: its fn "
        "with its kwargs, isolation, timeout_s, num_workers and memory_limit_mb, fn_weight, reward model "
        "(reward.model) and LLM judge (reward.judge; `policy` is the checkpoint)."
    ),
]
EnvOpt = Annotated[
    str | None, typer.Option(help="Play episodes of this environment (name or pkg.module:Class) instead.")
]
MaxTurnsOpt = Annotated[int, typer.Option(min=1, help="With --env/--agent: most model turns per episode.")]
MaxEpisodeTokensOpt = Annotated[
    int, typer.Option(min=1, help="With --env/--agent: most response tokens per episode.")
]
AgentOpt = Annotated[
    str | None,
    typer.Option(help="Play this agent (pkg.module:run, as rollout.source.agent) against the model instead."),
]
AgentTimeoutSOpt = Annotated[
    float, typer.Option(min=0.001, help="With --agent: seconds one episode may take.")
]
MaxPromptTokensOpt = Annotated[
    int,
    typer.Option(min=1, help="With --agent: the endpoint's context is this plus --max-episode-tokens."),
]
PromptKeyOpt = Annotated[str, typer.Option(help="The column holding the prompt (data.prompt_key).")]
AnswerKeyOpt = Annotated[str, typer.Option(help="The column read as `answer` (data.answer_key).")]
SystemPromptOpt = Annotated[
    str | None, typer.Option(help="A system message before every prompt (data.system_prompt).")
]
SplitOpt = Annotated[str | None, typer.Option(help="The split of a saved `datasets` directory (data.split).")]
ChatTemplateOpt = Annotated[
    str | None, typer.Option(help="A .jinja file or a built-in name (chatml), as model.chat_template.")
]


def evaluate(
    model: ModelOpt,
    data: DataOpt,
    reward: RewardOpt = "exact_match",
    max_new_tokens: MaxNewTokensOpt = 256,
    temperature: TemperatureOpt = 0.0,
    samples: SamplesOpt = 1,
    pass_k: PassKOpt = "",
    out: OutOpt = None,
    max_prompts: MaxPromptsOpt = None,
    device: DeviceOpt = "auto",
    engine: EngineOpt = "reference",
    dtype: DtypeOpt = "fp32",
    reward_timeout_s: RewardTimeoutSOpt = None,
    reward_config: RewardConfigOpt = None,
    env: EnvOpt = None,
    max_turns: MaxTurnsOpt = 4,
    max_episode_tokens: MaxEpisodeTokensOpt = 512,
    agent: AgentOpt = None,
    agent_timeout_s: AgentTimeoutSOpt = 300.0,
    max_prompt_tokens: MaxPromptTokensOpt = 1024,
    prompt_key: PromptKeyOpt = "prompt",
    answer_key: AnswerKeyOpt = "answer",
    system_prompt: SystemPromptOpt = None,
    split: SplitOpt = None,
    chat_template: ChatTemplateOpt = None,
) -> None:
    """Score a checkpoint on a prompt dataset (accuracy and mean reward), an environment's episodes, or an
    agent's."""
    with ErrorGuard():
        from ascent.data.fields import RowFields  # deferred: ascent.data imports torch

        # deferred: torch; the options are checked first
        from ascent.entrypoints.evaluate import run_agent_eval, run_env_eval, run_eval

        _refuse_prompt_options(reward_config, system_prompt, episodes=bool(env or agent))
        common: dict[str, Any] = dict(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            samples=samples,
            pass_k=_pass_k(pass_k, samples),
            fields=RowFields(prompt_key, answer_key, system_prompt, split, chat_template),
            out=out,
            max_prompts=max_prompts,
            device=device,
            engine=_choice("--engine", engine, ("reference", "fast")),
            dtype=_choice("--dtype", dtype, ("fp32", "bf16", "fp16")),
        )
        episodes: dict[str, Any] = dict(max_turns=max_turns, max_episode_tokens=max_episode_tokens)
        if agent is not None:
            metrics = run_agent_eval(
                model,
                data,
                agent,
                reward=reward,
                max_prompt_tokens=max_prompt_tokens,
                agent_timeout_s=agent_timeout_s,
                reward_timeout_s=reward_timeout_s,
                **episodes,
                **common,
            )
        elif env is not None:
            metrics = run_env_eval(model, data, env, **episodes, **common)
        else:
            metrics = run_eval(
                model=model,
                data=data,
                reward=reward,
                reward_timeout_s=reward_timeout_s,
                progress=True,
                reward_config=reward_config,
                **common,
            )
        for name, value in (metrics or {}).items():
            typer.echo(f"{name}: {_fmt_metric(value)}")
        if out and agent is None and env is None:
            typer.echo(f"responses written to {out}")


def _refuse_prompt_options(reward_config: str | None, system_prompt: str | None, episodes: bool) -> None:
    """--reward-config and --system-prompt are for prompt datasets: with --env or --agent, say what to drop."""
    if reward_config is not None and episodes:
        raise typer.BadParameter(
            "with --env or --agent the environment (or the agent's reward) scores the episodes; reward "
            "models and judges score single-turn prompts: drop --reward-config.",
            param_hint="--reward-config",
        )
    if system_prompt is not None and episodes:
        raise typer.BadParameter(
            "with --env or --agent the environment (or the agent) writes the prompts; put the system "
            "message there, or drop --system-prompt.",
            param_hint="--system-prompt",
        )


def _pass_k(value: str, samples: int) -> tuple[int, ...]:
    """--pass-k "1,4,8" -> (1, 4, 8); a BadParameter naming the option for anything else."""
    try:
        ks = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{value!r}: give whole numbers separated by commas, e.g. 1,4,8.", param_hint="--pass-k"
        ) from None
    bad = [k for k in ks if not 1 <= k <= samples]
    if bad:
        raise typer.BadParameter(
            f"{value!r}: each k must lie in 1..--samples={samples} ({bad} do not); raise --samples.",
            param_hint="--pass-k",
        )
    return ks


def _choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise AscentError(f"{option} {value}: unknown; use one of {', '.join(choices)}.")
    return value


def _fmt_metric(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) >= 1 else f"{value:.4f}"
    return str(value)
