"""Multi-turn episodes in the RL loop (`rollout.env`): prompts from the environments, groups from the runner.

`env_items` renders each row's prompt from its environment's `reset(row)` (so the length checks and the
prompt report work as for single-turn data); `collect_env_groups` plays a batch of rows through
`ascent.envs.run_episodes`, `samples_per_prompt` episodes per row, each turn one call spread over the rollout
replicas (every token stamped with the version that sampled it), its environments in the run's `EnvRunners`;
`env_metrics` reports rewards, turns and environment errors, which are bounded by `reward.max_failure_rate`
like reward failures.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ascent.cluster.base import WorkerGroup
from ascent.cluster.isolated import default_workers
from ascent.config.schema import RunConfig
from ascent.data.prompts import PromptItem, RenderReport
from ascent.envs import ChatTokens, Task, make_env, run_episodes
from ascent.envs.hosts import EnvHosts, HostedEnvs, Hosts, InProcessEnvs
from ascent.envs.rows import row_env
from ascent.envs.runner import started
from ascent.errors import AscentError
from ascent.messages import Generation, GenerationRequest, Group, SamplingParams, flatten
from ascent.orchestrator import batch as B
from ascent.orchestrator.workers import RolloutWorker

log = logging.getLogger("ascent")


class EnvFailureError(AscentError):
    """More episodes failed in their environment than `reward.max_failure_rate` allows."""


def env_name(row: dict[str, Any], default: str | None) -> str:
    """The row's own `env` (or SkyRL's `env_class`) column, else `rollout.env`."""
    return str(row_env(row) or default)


def env_items(rows: Sequence[dict[str, Any]], tok: Any, cfg: Any) -> tuple[list[PromptItem], RenderReport]:
    """Each row's prompt as its environment starts it (reset in the environment processes unless
    `rollout.env_isolation=inline`); rows whose prompt is over `data.max_prompt_tokens` are left out
    (reported). A row an environment refuses is an error naming the row."""
    limit, names = cfg.data.max_prompt_tokens, [env_name(row, cfg.rollout.env) for row in rows]
    chat, items, report = ChatTokens(tok), [], RenderReport(total=len(rows), max_tokens=limit)
    with env_hosts(cfg.rollout) as hosts:
        envs = HostedEnvs(hosts, names) if hosts else InProcessEnvs([make_env(n) for n in names])
        for i, (row, out) in enumerate(zip(rows, envs.reset(rows), strict=True)):
            ids = chat.prompt_ids(*started(Task(names[i], row, i), out))
            report.longest = max(report.longest, len(ids))
            if len(ids) > limit:
                report.dropped += 1
                continue
            items.append(PromptItem(row_id=i, prompt_ids=ids, prompt_text="", metadata=dict(row)))
    return items, report


@contextmanager
def env_hosts(r: Any) -> Iterator[EnvHosts | None]:
    """The environment processes of `rollout.env_isolation=process` for one batch on this machine (None when
    inline)."""
    if r.env_isolation == "inline":
        yield None
        return
    hosts = EnvHosts(default_workers(r.env_workers), r.env_timeout_s)
    try:
        yield hosts
    finally:
        hosts.close()


class EnvRunners:
    """Where a run's environments live, batch after batch: in the controller (`rollout.env_isolation=inline`),
    in processes started for each batch (`process` with cluster.backend=inline), or in Ray actors started
    on the first batch and kept until `close()` at the end of the run (`process` with cluster.backend=ray;
    `ascent.cluster.env_actors`). The runner is the same for all three; only the hosts differ."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._actors: Any = None
        self._lock = threading.Lock()  # the collector's thread and the controller's may both start a batch

    @contextmanager
    def batch(self) -> Iterator[Hosts | None]:
        """The hosts of one batch's environments (None: in this process)."""
        if self.cfg.cluster.backend != "ray" or self.cfg.rollout.env_isolation == "inline":
            with env_hosts(self.cfg.rollout) as hosts:
                yield hosts
        else:
            yield self._ray_actors()

    def _ray_actors(self) -> Any:
        with self._lock:
            if self._actors is None:
                from ascent.cluster.env_actors import RayEnvHosts  # deferred: Ray, only for env actors on Ray

                r, c = self.cfg.rollout, self.cfg.cluster
                self._actors = RayEnvHosts(
                    r.env_workers,
                    r.env_timeout_s,
                    cpus_per_host=r.env_cpus,
                    start_timeout_s=c.worker_timeout_s,
                    run_dir=self.cfg.run_dir,
                    log_level=self.cfg.tracking.log_level,
                )
                nodes = len(set(self._actors.node_ids()))
                log.info(
                    "environments: %d Ray actors of %g CPU on %d node(s)",
                    self._actors.num_hosts,
                    r.env_cpus,
                    nodes,
                )
            return self._actors

    def close(self) -> None:
        """Stop the Ray actors, if any were started."""
        with self._lock:
            if self._actors is not None:
                self._actors.close()
                self._actors = None


def collect_env_groups(
    envs: EnvRunners,
    rollout: WorkerGroup[RolloutWorker],
    tokenizer: Any,
    items: Sequence[Any],
    params: SamplingParams,
    *,
    seed: int,
) -> list[Group]:
    """`params.n` episodes of every item's environment (run in `envs`, each turn sampled on the `rollout`
    replicas) -> one group per item, in order."""
    r = envs.cfg.rollout
    n = params.n
    tasks = [Task(env_name(it.metadata, r.env), it.metadata, it.row_id) for it in items for _ in range(n)]

    def generate(requests: list[GenerationRequest]) -> list[list[Generation]]:
        # by request_id, the episode's index: each episode keeps its replica (and its cached history)
        shards, positions = B.shard_requests(requests, rollout.num_workers)
        flat = [g for out in rollout.call_split(RolloutWorker.generate, shards) for g in out.generations]
        return [flat[k] for k in positions]

    with envs.batch() as hosts:
        episodes = run_episodes(
            tasks,
            generate,
            ChatTokens(tokenizer),
            replace(params, seed=seed),
            max_turns=r.max_turns,
            max_tokens=r.max_episode_tokens,
            hosts=hosts,
        )
    return [Group(tuple(episodes[i * n : (i + 1) * n])) for i in range(len(items))]


def env_metrics(groups: Sequence[Group], max_failure_rate: float) -> dict[str, float]:
    """reward/mean|std, env/turns_mean, env/errors (episodes whose environment raised); raises when their
    share is over `max_failure_rate`. Episodes of simulators (metadata `success`, `episode_length`:
    `ascent.envs.sim`) add env/success_rate and env/episode_length (simulator steps), over those episodes."""
    episodes = flatten(groups)
    rewards = [e.reward for e in episodes]
    mean = sum(rewards) / len(rewards)
    errors = [e for e in episodes if "env_error" in e.metadata]
    if len(errors) > max_failure_rate * len(episodes):
        raise EnvFailureError(
            f"reward.max_failure_rate={max_failure_rate}: {len(errors)} of {len(episodes)} episodes "
            "failed in "
            f"their environment (first: row {errors[0].row_id + 1}: {errors[0].metadata['env_error']}). "
            "Fix the "
            "environment (`ascent debug env` shows episodes turn by turn), or raise reward.max_failure_rate."
        )
    return {
        "reward/mean": mean,
        "reward/std": (sum((x - mean) ** 2 for x in rewards) / len(rewards)) ** 0.5,
        "env/turns_mean": sum(e.metadata.get("turns", 0) for e in episodes) / len(episodes),
        "env/errors": float(len(errors)),
        # prompt tokens the episodes' turns sent, and those the engine reused from its session cache
        "rollout/prompt_tokens": float(sum(e.metadata.get("prompt_tokens", 0) for e in episodes)),
        "rollout/prefix_reused_tokens": float(sum(e.metadata.get("cached_tokens", 0) for e in episodes)),
    } | outcome_metrics(groups)


def outcome_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """env/success_rate and env/episode_length over the groups whose episodes report them (a group is one
    row's environment; its episodes that ended before their simulator answered, e.g. a first turn cut by
    max_new_tokens, count as failures of length 0). No group reports: no keys."""
    episodes = [e for g in groups if any("success" in e.metadata for e in g.episodes) for e in g.episodes]
    if not episodes:
        return {}
    return {
        "env/success_rate": sum(e.metadata.get("success") is True for e in episodes) / len(episodes),
        "env/episode_length": sum(float(e.metadata.get("episode_length", 0)) for e in episodes)
        / len(episodes),
    }
