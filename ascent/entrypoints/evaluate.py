"""`ascent eval`: score a checkpoint on a prompt dataset with a reward function (accuracy, mean reward), on an
environment's episodes (`--env`), or with an agent written against the OpenAI API (`--agent`).

It runs the same pieces as validation inside `ascent train`: prompt rendering, the rollout engine, the
reward runner; environments in worker processes; for an agent, the endpoint and agent processes that an agent
`rollout.source` trains through (`ascent.orchestrator.agents`), served from the evaluated checkpoint. Greedy
decoding by default, so two evaluations of one checkpoint agree. Metrics: accuracy, mean reward, pass@k and
mean@k for `--pass-k` (from `--samples` samples per prompt), the same per `data_source` and environment, and
the reward components (`ascent.orchestrator.eval_metrics`). With `progress` (the CLI's case) the prompts
go to the engine in about `PROGRESS_PARTS` parts of whole generation batches, each followed by a progress
line (`ascent.tracking.Progress`), so a long evaluation is not silent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ascent.cluster.hosts import ProcessHosts, default_workers
from ascent.config.rollout import RolloutConfig
from ascent.config.schema import RewardConfig
from ascent.data import image_codec, render_prompts, validate_rows
from ascent.data.fields import RowFields
from ascent.data.templates import set_chat_template
from ascent.entrypoints.debug_env import record
from ascent.entrypoints.eval_rewards import eval_components, read_reward_config
from ascent.envs import ChatTokens, Task, run_episodes
from ascent.envs.openai_agents import AgentLoadError, load_agent
from ascent.envs.rows import row_env
from ascent.errors import AscentError
from ascent.messages import Generation, GenerationRequest, SamplingParams, flatten
from ascent.models.loading import load_tokenizer, resolve_device
from ascent.orchestrator.agents import AgentService, AgentSetup, play_agent_groups, score_last_replies
from ascent.orchestrator.batch import make_requests, to_groups
from ascent.orchestrator.episodes import env_image_encoder, env_policy
from ascent.orchestrator.eval_metrics import CORRECT_AT, episode_sample, eval_metrics
from ascent.orchestrator.sampling import Scorer
from ascent.orchestrator.setup import agent_items, reward_hosts
from ascent.rewards import RewardFailureError, RewardRunner
from ascent.rewards.builtin import ANSWER_KEY_SETTING
from ascent.rollout import RolloutEngine, build_engine
from ascent.tracking import Progress

log = logging.getLogger("ascent")
ALL_BUT_NONE = 1.0 - 1e-9  # the reward runner raises only when every call failed
# the settings reward errors name (`ascent train`'s) -> eval's options: --answer-key renames the column the
# reward reads as `answer` (with --reward-config, that file's reward.kwargs apply as well)
EVAL_SETTINGS = {ANSWER_KEY_SETTING: "--answer-key"}
PROGRESS_PARTS = 20  # engine calls of a run_eval with progress (fewer when there are fewer batches)


def run_eval(
    model: str,
    data: str,
    reward: str = "exact_match",
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    samples: int = 1,
    pass_k: tuple[int, ...] = (),
    fields: RowFields = RowFields(),
    out: str | None = None,
    max_prompts: int | None = None,
    device: str = "auto",
    max_prompt_tokens: int = 1024,
    seed: int = 0,
    batch_size: int = 64,
    engine: str = "reference",
    dtype: str = "fp32",
    reward_timeout_s: float | None = None,
    progress: bool = False,
    reward_config: str | None = None,
) -> dict[str, float]:
    """Generate for every prompt of `data` with the checkpoint at `model`; return accuracy and mean reward.
    `progress`: print progress lines on stdout while generating (see the module). `reward_config`: a YAML
    whose `reward` section (function, fn_weight, reward model, judge) replaces `reward`
    (`ascent.entrypoints.eval_rewards`), and whose kwargs, isolation, timeout_s, num_workers and
    memory_limit_mb apply as in training (`reward_timeout_s`, when given, overrides its timeout_s)."""
    rcfg = read_reward_config(reward_config) if reward_config else None
    reward = rcfg.fn if rcfg is not None else reward
    hosting = reward_hosting(rcfg, reward_timeout_s)

    tok = set_chat_template(load_tokenizer(model), fields.chat_template, "--chat-template")
    rows = fields.rows(data)
    validate_rows(rows, data, tokenizer_vocab_size=len(tok))
    rows = rows[:max_prompts] if max_prompts else rows
    items, _ = render_prompts(
        rows, tok, max_prompt_tokens=max_prompt_tokens, overlong="truncate", codec=image_codec(model)
    )
    decode, runner, rollout = (
        _scorer_and_engine(  # the reward resolves first: a bad --reward fails in a second
            tok, reward, hosting, engine, model, dtype, device, batch_size
        )
    )
    components = () if rcfg is None else eval_components(rcfg, model, tok, rollout, device)
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, n=samples)
    requests = make_requests([i.prompt_ids for i in items], params, seed, [i.images for i in items])
    gens = generate_with_progress(rollout, requests, batch_size) if progress else rollout.generate(requests)
    scorer = Scorer(runner, decode, components, rcfg.fn_weight if rcfg is not None else 1.0)
    option = (
        f"--reward-config {reward_config} (reward.fn={reward})" if rcfg is not None else f"--reward {reward}"
    )
    try:
        groups, reward_metrics = scorer(to_groups(items, gens, decode=decode, policy_version=0))
    except RewardFailureError as err:
        raise every_call_failed(err, option, hosting.timeout_s) from err
    finally:
        runner.close()
    scored = flatten(groups)
    failures = reward_metrics.get("reward/failures", 0.0)
    if failures:
        log.warning("%d of %d reward calls failed and count as 0", failures, len(scored))
    n = len(scored)
    metrics = {
        **eval_metrics([episode_sample(t) for t in scored], pass_k),
        **{k: v for k, v in reward_metrics.items() if k.count("/") == 2},  # reward/<component>/<stat>
        "response_len_mean": sum(len(t.response_ids) for t in scored) / n,
        "responses": float(n),
        "reward_failures": failures,
    }
    if out:
        _write_responses(out, scored, [t.reward for t in scored])
    return metrics


def every_call_failed(err: RewardFailureError, option: str, timeout_s: float) -> AscentError:
    """The evaluation's error when every reward call failed (its runner stops at nothing less), in its own
    options' words: `option` names the reward function (`--reward X`), and --reward-timeout-s the timeout
    (the runner's message speaks of reward.max_failure_rate, which an evaluation does not have)."""
    return AscentError(
        f"{option}: all {err.total} reward calls failed, so there is no accuracy to report; first error on "
        f"row {err.row}: {err.first_error}. Fix the reward function (`ascent eval` scores 0 for a call that "
        f"fails, and stops only when every call does), or raise --reward-timeout-s={timeout_s:g} if the "
        "calls timed out."
    )


def generate_with_progress(
    engine: RolloutEngine, requests: list[GenerationRequest], batch_size: int
) -> list[list[Generation]]:
    """`engine.generate(requests)` in parts of whole batches of `batch_size` requests (about
    `PROGRESS_PARTS`), a progress line (part, tokens/s, ETA) after each; the same generations, in order."""
    size = batch_size * max(1, math.ceil(len(requests) / batch_size / PROGRESS_PARTS))
    parts = [requests[i : i + size] for i in range(0, len(requests), size)]
    gens: list[list[Generation]] = []
    tokens, t0 = 0, time.perf_counter()
    with Progress(len(parts)) as progress:
        for done, part in enumerate(parts, start=1):
            gens += engine.generate(part)
            tokens += sum(len(g.token_ids) for group in gens[-len(part) :] for g in group)
            progress.update(done, {"perf/tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9)})
    return gens


def _write_responses(out: str, trajs: list[Any], rewards: list[float]) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t, r in zip(trajs, rewards, strict=True):
            f.write(json.dumps({"row_id": t.row_id, "response": t.response_text, "reward": r}) + "\n")


def run_env_eval(
    model: str,
    data: str,
    env: str,
    *,
    max_turns: int = 4,
    max_episode_tokens: int = 512,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    samples: int = 1,
    pass_k: tuple[int, ...] = (),
    fields: RowFields = RowFields(),
    out: str | None = None,
    max_prompts: int | None = None,
    device: str = "auto",
    seed: int = 0,
    batch_size: int = 256,
    engine: str = "reference",
    dtype: str = "fp32",
    env_timeout_s: float = 60.0,
) -> dict[str, float]:
    """Play `samples` episodes of every row of `data` in `env` (a row's own `env` column wins) with the
    checkpoint at `model`, the environments in worker processes as in training; accuracy is the share of
    episodes with reward >= 1."""

    tok = set_chat_template(load_tokenizer(model), fields.chat_template, "--chat-template")
    rows = fields.rows(data)[:max_prompts]
    chat = ChatTokens(tok)
    tasks = [Task(row_env(r) or env, r, i) for i, r in enumerate(rows) for _ in range(samples)]
    rollout = build_engine(
        engine,
        model_path=model,
        dtype=dtype,
        device=resolve_device(device),
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        decode=chat.decode,
        generation_batch_size=batch_size,
    )
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    hosts = ProcessHosts(default_workers(None), env_policy(RolloutConfig(env_timeout_s=env_timeout_s)))
    try:
        episodes = run_episodes(
            tasks,
            rollout.generate,
            chat,
            params,
            max_turns=max_turns,
            max_tokens=max_episode_tokens,
            hosts=hosts,
            images=env_image_encoder(model),
        )
    finally:
        hosts.close()
    n = len(episodes)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            f.writelines(json.dumps(record(e, chat.decode)) + "\n" for e in episodes)
    return {
        **eval_metrics([episode_sample(e, env) for e in episodes], pass_k),
        "turns_mean": sum(e.metadata.get("turns", 0) for e in episodes) / n,
        "response_len_mean": sum(len(e.response_ids) for e in episodes) / n,
        "episodes": float(n),
        "env_errors": float(sum("env_error" in e.metadata for e in episodes)),
    }


def run_agent_eval(
    model: str,
    data: str,
    agent: str,
    *,
    reward: str = "exact_match",
    max_turns: int = 4,
    max_episode_tokens: int = 512,
    max_prompt_tokens: int = 1024,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    samples: int = 1,
    pass_k: tuple[int, ...] = (),
    fields: RowFields = RowFields(),
    out: str | None = None,
    max_prompts: int | None = None,
    device: str = "auto",
    batch_size: int = 256,
    engine: str = "reference",
    dtype: str = "fp32",
    agent_timeout_s: float = 300.0,
    reward_timeout_s: float | None = None,
) -> dict[str, float]:
    """Play `samples` episodes of the agent at `agent` (pkg.module:run) on every row of `data`, against an
    endpoint served from the checkpoint at `model` as `rollout.source.agent` serves the policy (the endpoint's
    context: `max_prompt_tokens + max_episode_tokens`); `reward` scores the last reply of an episode whose
    agent returns None. Accuracy is the share of episodes with reward >= 1; an episode that failed counts as
    0."""

    try:  # a bad --agent fails before anything heavy starts
        load_agent(agent)
    except AgentLoadError as err:
        raise AgentLoadError(str(err).replace("rollout.source.agent", "--agent")) from err
    tok = set_chat_template(load_tokenizer(model), fields.chat_template, "--chat-template")
    rows = fields.rows(data)[:max_prompts]
    hosting = reward_hosting(None, reward_timeout_s)
    decode, rewards, rollout = _scorer_and_engine(
        tok,
        reward,
        hosting,
        engine,
        model,
        dtype,
        device,
        batch_size,
    )
    setup = AgentSetup(
        agent,
        agent_timeout_s,
        concurrency=32,
        workers=None,
        inline=False,
        max_prompt_tokens=max_prompt_tokens,
        max_episode_tokens=max_episode_tokens,
        max_new_tokens=max_new_tokens,
        max_turns=max_turns,
        memory_mb=RolloutConfig().env_memory_limit_mb,
    )
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, n=samples)
    with contextlib.ExitStack() as stack:  # the reward processes, the endpoint and the agent processes
        stack.callback(rewards.close)
        service = AgentService(setup, rollout.generate, params, tok)
        stack.callback(service.close)
        groups, unscored, stats = play_agent_groups(service, agent_items(rows), params, decode)
        stats.require_calls()
        try:
            score_last_replies(rewards, decode, groups, unscored)
        except RewardFailureError as err:
            raise every_call_failed(err, f"--reward {reward}", hosting.timeout_s) from err
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            f.writelines(json.dumps(_agent_record(e, decode)) + "\n" for g in groups for e in g)
    return _agent_metrics(groups, stats, pass_k)


def _agent_metrics(groups: list[list[Any]], stats: Any, pass_k: tuple[int, ...] = ()) -> dict[str, float]:
    """eval --env's metrics over the plays (`stats.sessions`: one that failed before any call counts as 0),
    each play by its first segment (which holds its reward), and the plays' errors and truncations; pass@k
    and the per-source metrics over the plays that made a call."""
    firsts: dict[str, Any] = {}
    for e in (e for g in groups for e in g):
        firsts.setdefault(e.metadata["session"], e)
    episodes, n = list(firsts.values()), stats.sessions
    scored = eval_metrics([episode_sample(e) for e in episodes], pass_k)
    return {
        **{k: v for k, v in scored.items() if k not in ("accuracy", "reward_mean")},
        "accuracy": sum(e.reward >= CORRECT_AT for e in episodes) / n,
        "reward_mean": sum(e.reward for e in episodes) / n,
        "turns_mean": sum(e.metadata.get("turns", 0) for e in episodes) / n,
        "response_len_mean": sum(len(e.response_ids) for e in episodes) / n,
        "episodes": float(n),
        "agent_errors": float(stats.errors),
        "agent_truncated": float(stats.truncated),
    }


def _agent_record(e: Any, decode: Any) -> dict[str, Any]:
    return {
        **record(e, decode),
        "session": e.metadata["session"],
        **({"truncated": e.metadata["truncated"]} if "truncated" in e.metadata else {}),
    }


def reward_hosting(rcfg: RewardConfig | None, timeout_s: float | None) -> RewardConfig:
    """How an evaluation runs its reward function: as `--reward-config`'s reward section says (kwargs,
    isolation, timeout, workers, memory), else as training's defaults; `--reward-timeout-s` (`timeout_s`),
    when given, replaces the timeout."""
    base = rcfg if rcfg is not None else RewardConfig()
    return base if timeout_s is None else base.model_copy(update={"timeout_s": timeout_s})


def _scorer_and_engine(
    tok: Any,
    reward: str,
    hosting: RewardConfig,
    engine: str,
    model: str,
    dtype: str,
    device: str,
    batch_size: int,
) -> tuple[Callable[[Sequence[int]], str], RewardRunner, Any]:
    """What every evaluation builds: the decode of `tok`, the reward runner of `reward` (every failure
    counted, none fatal; `hosting`: its kwargs and its hosts' isolation, timeout, workers and memory, see
    `reward_hosting`) and the `engine` holding `model`."""
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    runner = RewardRunner(
        reward,
        kwargs=hosting.kwargs,
        max_failure_rate=ALL_BUT_NONE,
        logger=log,
        executor=reward_hosts(hosting),
        settings=EVAL_SETTINGS,
    )
    rollout = build_engine(
        engine,
        model_path=model,
        dtype=dtype,
        device=resolve_device(device),
        eos_token_ids=[tok.eos_token_id],
        pad_token_id=tok.pad_token_id,
        decode=decode,
        generation_batch_size=batch_size,
    )
    return decode, runner, rollout
