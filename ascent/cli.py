"""The `ascent` command: train, sft, eval, episodes, serve, studio, doctor, debug env, config, bench, version.

Every command loads and validates its configuration first (fast, no torch) and imports the heavy
orchestrator lazily, so a bad config fails in a fraction of a second. Errors the user can fix
(`AscentError` and subclasses such as ConfigError, plus the data package's DataError) print as
`error: <message>` and exit with code 2, without a traceback (`ascent --debug ...` or `ASCENT_DEBUG=1` adds
it); so do the environment's errors that name a file (OSError: no space, no permission) and out-of-memory.
A run stopped by SIGTERM/SIGINT at a safe point exits with 128 + the signal number (143, 130) and says
which checkpoint holds it. Anything else is a bug: a normal traceback and exit code 1.
"""

from __future__ import annotations

import atexit
import gc
import os
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Annotated, Any

import typer

from ascent.config import RunConfig, SFTConfig
from ascent.entrypoints.config_show import config_show_command
from ascent.entrypoints.doctor import doctor_command
from ascent.entrypoints.episodes import episodes_command
from ascent.entrypoints.guard import ErrorGuard, load_for_command, require_model_path
from ascent.entrypoints.serve import serve_command
from ascent.entrypoints.studio import studio_command
from ascent.errors import AscentError
from ascent.plugins import add_plugin_root

REPO_ROOT = Path(__file__).resolve().parents[1]

app = typer.Typer(
    name="ascent",
    help="Reinforcement-learning post-training for language models: GRPO, PPO, DAPO and relatives.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
config_app = typer.Typer(help="Inspect configurations.", no_args_is_help=True, rich_markup_mode=None)
bench_app = typer.Typer(
    help="Benchmarks from the source checkout's bench/ folder.", no_args_is_help=True, rich_markup_mode=None
)
debug_app = typer.Typer(help="Look inside before a long run.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(config_app, name="config")
app.add_typer(bench_app, name="bench")
app.add_typer(debug_app, name="debug")

ConfigArg = Annotated[str, typer.Argument(help="Run config YAML file (run.yaml).", show_default=False)]
OptionalConfigArg = Annotated[
    str | None, typer.Argument(help="Config YAML file; omitted: defaults only.", show_default=False)
]
OverridesArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="Dotted key=value overrides, e.g. train.lr=1e-5 rollout.stop_token_ids=[1,2].",
        show_default=False,
    ),
]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint in run_dir.")]
ResumeFromOpt = Annotated[
    str | None,
    typer.Option(
        "--resume-from",
        help="Resume from this checkpoint (a name like iter_000004, or a path) instead of the newest.",
        show_default=False,
    ),
]
AcceptChangesOpt = Annotated[
    bool,
    typer.Option(
        "--accept-changes",
        help="Resume even though settings that break an exact continuation changed (model, data, seed, "
        "batch sizes, algorithm); they are listed in the log.",
    ),
]


# ---------------------------------------------------------------- commands


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks with error messages (same as ASCENT_DEBUG=1).")
    ] = False,
) -> None:
    if debug:
        os.environ["ASCENT_DEBUG"] = "1"
    if version:
        typer.echo(f"ascent {package_version()}")
        raise typer.Exit()


@app.command()
def train(
    config: ConfigArg,
    overrides: OverridesArg = None,
    resume: ResumeOpt = False,
    resume_from: ResumeFromOpt = None,
    accept_changes: AcceptChangesOpt = False,
) -> None:
    """Run RL training (GRPO, PPO, ...).

    Example: ascent train run.yaml rollout.samples_per_prompt=8 train.lr=1e-6
    """
    with ErrorGuard(resumable=True) as guard:
        cfg = load_for_command(config, overrides, RunConfig, resume or resume_from is not None)
        require_model_path(cfg)
        guard.run_dir = cfg.run_dir
        from ascent.entrypoints.train import run_training  # deferred: torch; the config is checked first

        run_training(cfg, resume_from=resume_from, accept_changes=accept_changes)


@app.command()
def sft(
    config: ConfigArg,
    overrides: OverridesArg = None,
    resume: ResumeOpt = False,
    resume_from: ResumeFromOpt = None,
    accept_changes: AcceptChangesOpt = False,
) -> None:
    """Supervised fine-tuning on prompt/response pairs.

    Example: ascent sft sft.yaml train.lr=1e-5 epochs=2
    """
    with ErrorGuard(resumable=True) as guard:
        cfg = load_for_command(config, overrides, SFTConfig, resume or resume_from is not None)
        require_model_path(cfg)
        guard.run_dir = cfg.run_dir
        from ascent.entrypoints.sft import run_sft  # deferred: torch; the config is checked first

        run_sft(cfg, resume_from=resume_from, accept_changes=accept_changes)


@app.command("eval")
def evaluate(
    model: Annotated[str, typer.Option("--model", help="Checkpoint directory (Hugging Face format).")],
    data: Annotated[str, typer.Option("--data", help="Prompts: a .jsonl or .parquet file.")],
    reward: Annotated[str, typer.Option(help="Reward function name or pkg.module:function.")] = "exact_match",
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Most tokens generated per response.")] = 256,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature; 0 is greedy.")] = 0.0,
    samples: Annotated[int, typer.Option(min=1, help="Responses per prompt.")] = 1,
    pass_k: Annotated[
        str,
        typer.Option(
            help="Report pass@k and mean@k for these k, comma-separated (e.g. 1,4,8; each at most --samples)."
        ),
    ] = "",
    out: Annotated[
        str | None, typer.Option(help="Write every response and its reward to this JSONL file.")
    ] = None,
    max_prompts: Annotated[int | None, typer.Option(min=1, help="Evaluate only the first N prompts.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    engine: Annotated[
        str,
        typer.Option(help="Rollout engine: reference (transformers, any device) or fast (the GPU engine)."),
    ] = "reference",
    dtype: Annotated[
        str, typer.Option(help="fp32, bf16 or fp16: the dtype you train and sample with.")
    ] = "fp32",
    reward_timeout_s: Annotated[
        float, typer.Option(min=0.001, help="Seconds one reward call may take (it then scores 0).")
    ] = 30.0,
    reward_config: Annotated[
        str | None,
        typer.Option(
            help="A YAML whose `reward` section (a train config works) scores instead of --reward: its fn, "
            "fn_weight, reward model (reward.model) and LLM judge (reward.judge; `policy` is the checkpoint)."
        ),
    ] = None,
    env: Annotated[
        str | None, typer.Option(help="Play episodes of this environment (name or pkg.module:Class) instead.")
    ] = None,
    max_turns: Annotated[
        int, typer.Option(min=1, help="With --env/--agent: most model turns per episode.")
    ] = 4,
    max_episode_tokens: Annotated[
        int, typer.Option(min=1, help="With --env/--agent: most response tokens per episode.")
    ] = 512,
    agent: Annotated[
        str | None,
        typer.Option(
            help="Play this agent (pkg.module:run, as rollout.source.agent) against the model instead."
        ),
    ] = None,
    agent_timeout_s: Annotated[
        float, typer.Option(min=0.001, help="With --agent: seconds one episode may take.")
    ] = 300.0,
    max_prompt_tokens: Annotated[
        int,
        typer.Option(min=1, help="With --agent: the endpoint's context is this plus --max-episode-tokens."),
    ] = 1024,
    prompt_key: Annotated[
        str, typer.Option(help="The column holding the prompt (data.prompt_key).")
    ] = "prompt",
    answer_key: Annotated[
        str, typer.Option(help="The column read as `answer` (data.answer_key).")
    ] = "answer",
    system_prompt: Annotated[
        str | None, typer.Option(help="A system message before every prompt (data.system_prompt).")
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="The split of a saved `datasets` directory (data.split).")
    ] = None,
    chat_template: Annotated[
        str | None, typer.Option(help="A .jinja file or a built-in name (chatml), as model.chat_template.")
    ] = None,
) -> None:
    """Score a checkpoint on a prompt dataset (accuracy and mean reward), an environment's episodes, or an
    agent's."""
    with ErrorGuard():
        from ascent.data.fields import RowFields  # deferred: ascent.data imports torch

        # deferred: torch; the options are checked first
        from ascent.entrypoints.evaluate import run_agent_eval, run_env_eval, run_eval

        if reward_config is not None and (env or agent):
            raise typer.BadParameter(
                "with --env or --agent the environment (or the agent's reward) scores the episodes; reward "
                "models and judges score single-turn prompts: drop --reward-config.",
                param_hint="--reward-config",
            )
        if system_prompt is not None and (env or agent):
            raise typer.BadParameter(
                "with --env or --agent the environment (or the agent) writes the prompts; put the system "
                "message there, or drop --system-prompt.",
                param_hint="--system-prompt",
            )

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


@debug_app.command("env")
def debug_env(
    model: Annotated[str, typer.Option("--model", help="Checkpoint directory (Hugging Face format).")],
    data: Annotated[str, typer.Option("--data", help="Rows: a .jsonl or .parquet file.")],
    env: Annotated[
        str | None, typer.Option(help="Environment name or pkg.module:Class (else each row's `env`).")
    ] = None,
    episodes: Annotated[int, typer.Option(min=1, help="Episodes to run (one per row, from the first).")] = 4,
    max_turns: Annotated[int, typer.Option(min=1, help="Most model turns per episode.")] = 4,
    max_tokens: Annotated[int, typer.Option(min=1, help="Most response tokens per episode.")] = 256,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Most tokens per model turn.")] = 32,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature; 0 is greedy.")] = 1.0,
    out: Annotated[
        str | None, typer.Option(help="Write the episodes (ids, masks, text) to this JSONL.")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "cpu",
    random_actions: Annotated[
        bool, typer.Option(help="Simulators: play random actions instead of the model (its tokenizer only).")
    ] = False,
    frames: Annotated[
        str | None, typer.Option(help="Simulators: write each episode's frames (PNG strip, GIF) here.")
    ] = None,
) -> None:
    """Run a few episodes of an environment inline and print them turn by turn."""
    with ErrorGuard():
        # deferred: torch; the options are checked first
        from ascent.entrypoints.debug_env import run_debug_env

        run_debug_env(
            model,
            data,
            env,
            episodes,
            max_turns,
            max_tokens,
            max_new_tokens,
            temperature,
            out,
            device,
            random_actions=random_actions,
            frames=frames,
        )
        if out:
            typer.echo(f"episodes written to {out}")


config_app.command("show")(config_show_command)  # the body: ascent/entrypoints/config_show.py
app.command("episodes")(episodes_command)  # the body: ascent/entrypoints/episodes.py
app.command("serve")(serve_command)  # the body: ascent/entrypoints/serve.py
app.command("studio")(studio_command)  # the body: ascent/entrypoints/studio.py
app.command("doctor")(doctor_command)  # the body: ascent/entrypoints/doctor.py; checks in ascent/doctor/


@app.command()
def version() -> None:
    """Print the installed ascent version."""
    typer.echo(f"ascent {package_version()}")


_FORWARD = {"allow_extra_args": True, "ignore_unknown_options": True}


BENCHES = {  # `ascent bench NAME ARGS...` runs bench/NAME.py's main(ARGS)
    "rollout": "Rollout throughput benchmark",
    "e2e": "End-to-end training benchmark",
    "multiturn": "Multi-turn prefix-reuse benchmark of the fast engine",
    "swap_wait": "Trainer wait with and without weight swaps between decode steps",
}


def _bench_command(name: str, what: str) -> None:
    def command(ctx: typer.Context) -> None:
        from ascent.entrypoints.bench import run_bench  # deferred: only `ascent bench` needs it

        with ErrorGuard():
            run_bench(name, ctx.args, REPO_ROOT)

    command.__doc__ = f"{what}: forwards all arguments to bench/{name}.py."
    bench_app.command(name, context_settings=_FORWARD, add_help_option=False)(command)


for _bench in BENCHES.items():
    _bench_command(*_bench)


# ---------------------------------------------------------------- helpers


def package_version() -> str:
    try:
        return dist_version("ascent")
    except PackageNotFoundError:  # a source checkout that was not pip-installed
        import tomllib  # deferred: only a source checkout's --version reads pyproject.toml

        try:
            project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
            return f"{project['version']} (source checkout, not installed)"
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown (not installed)"


def _choice(option: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise AscentError(f"{option} {value}: unknown; use one of {', '.join(choices)}.")
    return value


def _fmt_metric(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) >= 1 else f"{value:.4f}"
    return str(value)


def main(argv: list[str] | None = None) -> None:
    """Console entry point (`ascent`, `python -m ascent`)."""
    # Registered first, so it runs last at exit, after the trackers', Ray's and the pools' handlers: the
    # interpreter's final garbage collection would walk every object of torch, transformers and the run only
    # to free memory the OS takes back anyway (~1 s of every command on a small CPU). Frozen objects are left
    # out of that collection; the process still releases everything when it ends.
    atexit.register(gc.freeze)
    # Plug-ins named by import path (reward.fn=mypkg.rewards:score) resolve from the current directory, as
    # under `python -m`, in this process and in every worker process the run starts (through PYTHONPATH).
    add_plugin_root()
    app(args=argv, prog_name="ascent")


if __name__ == "__main__":
    main()
