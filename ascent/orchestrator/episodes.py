"""Multi-turn episodes in the RL loop (an env `rollout.source`): prompts from the environments, groups from
the runner.

`env_items` renders each row's prompt from its environment's `reset(row)` (so the length checks and the
prompt report work as for single-turn data); `collect_env_groups` plays a batch of rows through
`ascent.envs.run_episodes`, `samples_per_prompt` episodes per row, each turn one call spread over the rollout
replicas (every token stamped with the version that sampled it), its environments in the run's `EnvRunners`;
`env_metrics` reports rewards, turns and environment errors, which are bounded by `reward.max_failure_rate`
like reward failures.

Environments that show images (`zoom_qa`) need the model's image encoder: `env_image_encoder` loads the
checkpoint's `ImageCodec` when `model.path` is a vision-language model (None for a text model), and both the
prompt report and the runner encode with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ascent.cluster.base import WorkerGroup
from ascent.cluster.hosts import IsolationPolicy, ProcessHosts, default_workers
from ascent.config.rollout import RolloutConfig
from ascent.config.schema import RunConfig
from ascent.data import image_codec
from ascent.data.images import BadImageRow, overlong_image_problem
from ascent.data.prompts import PromptItem, RenderReport
from ascent.envs import ChatTokens, Task, run_episodes
from ascent.envs.base import Message
from ascent.envs.hosts import HostedEnvs, Hosts, InlineHosts
from ascent.envs.images import ImageEncoder
from ascent.envs.rows import UnusableRowError, row_env, unusable_row
from ascent.envs.runner import EnvResetError, prompt_tokens
from ascent.envs.sim import HostedSimEnvs
from ascent.errors import AscentError
from ascent.messages import Generation, GenerationRequest, Group, SamplingParams, flatten
from ascent.orchestrator import batch as B
from ascent.orchestrator.workers import RolloutWorker
from ascent.plugins import check_import

RESETS_PER_HOST = 4  # start-up resets sent per host at a time (`resets_in_chunks`)
log = logging.getLogger("ascent")
FRAMES = (
    "frames"  # <run_dir>/frames: simulator frames, next to experience.db (ascent.studio.episodes reads them)
)


class EnvFailureError(AscentError):
    """More episodes failed in their environment than `reward.max_failure_rate` allows."""


def env_name(row: dict[str, Any], default: str | None) -> str:
    """The row's own `env` (or SkyRL's `env_class`) column, else `default` (the env source's `env`)."""
    return str(row_env(row) or default)


def env_items(
    rows: Sequence[dict[str, Any]], tok: Any, env: str, cfg: Any, source: str = "dataset"
) -> tuple[list[PromptItem], RenderReport]:
    """Each row's prompt as its environment (its `env` column, else `env`) starts it (reset in the
    environment processes unless `rollout.env_isolation=inline`). Left out, warned with the row number and
    counted in the report: a row whose image or video is missing or unreadable (its reset failed with
    `UnusableRowError`) and a row whose prompt is over `data.max_prompt_tokens` (with its image tokens and
    the fix when it shows images). Any other failed reset is an error naming the row."""
    limit, names = cfg.data.max_prompt_tokens, [env_name(row, env) for row in rows]
    check_env_imports(names, env)
    chat, items, report = ChatTokens(tok), [], RenderReport(total=len(rows), max_tokens=limit)
    images = env_image_encoder(cfg.model.path, cfg.model.min_pixels, cfg.model.max_pixels)
    with env_hosts(cfg.rollout) as hosts:
        for i, row, out in resets_in_chunks(hosts, names, rows):
            problem = unusable_row(out)
            if problem is not None:
                report.drop_bad_image(i, BadImageRow(f"row {i + 1}: {names[i]}.reset: {problem}"), source)
                continue
            try:
                ids, shown = prompt_tokens(chat, images, Task(names[i], row, i), out)  # image tokens counted
            except EnvResetError as err:
                if not isinstance(err.__cause__, UnusableRowError):
                    raise
                report.drop_bad_image(i, BadImageRow(str(err)), source)  # pixels the image processor refuses
                continue
            report.longest = max(report.longest, len(ids))
            if len(ids) > limit and shown:
                problem = overlong_image_problem(i + 1, len(ids), shown, limit, "data.max_prompt_tokens")
                report.drop_overlong_images(i, problem, source)
            elif len(ids) > limit:
                report.dropped += 1
            else:
                report.image_tokens += [im.num_tokens for im in shown]
                items.append(PromptItem(row_id=i, prompt_ids=ids, prompt_text="", metadata=dict(row)))
    return items, report


def check_env_imports(names: Sequence[str], env: str) -> None:
    """Import each environment module named by import path (the run's `env`, rows' `env` columns) in a
    child interpreter (`ascent.plugins.check_import`): one that ends its process at import is a PluginError
    naming it, rather than every reset failing as "its process died"."""
    first: dict[str, int] = {}
    for k, name in enumerate(names):
        first.setdefault(name, k)
    for name, k in first.items():
        if ":" in name:
            check_import(name, "rollout.source.env" if name == env else f"row {k + 1} env")


def resets_in_chunks(
    hosts: Hosts, names: Sequence[str], rows: Sequence[dict[str, Any]]
) -> Iterator[tuple[int, dict[str, Any], tuple[list[Message], Any] | str]]:
    """(row index, row, its reset's messages and tools or why it failed), a few rows per host at a time, so
    that a caller who stops at the first failed reset waits for one chunk of timeouts, not for every row's."""
    size = hosts.num_hosts * RESETS_PER_HOST
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        envs = HostedEnvs(hosts, names[start : start + size])
        try:
            yield from zip(range(start, start + len(chunk)), chunk, envs.reset(chunk), strict=True)
        finally:
            envs.close()


def env_image_encoder(
    model_path: str, min_pixels: int | None = None, max_pixels: int | None = None
) -> ImageEncoder | None:
    """The image codec of the checkpoint in `model_path` for environments that show images, under the same
    pixel budget as the data's (`model.min_pixels` / `model.max_pixels`); None for a text model (an
    environment that shows one an image then costs its episode, saying so)."""
    return image_codec(model_path, min_pixels, max_pixels)


def env_policy(r: RolloutConfig) -> IsolationPolicy:
    """The isolation policy of environments (`rollout.env_timeout_s`, `rollout.env_memory_limit_mb`), on
    process hosts and Ray actors."""
    return IsolationPolicy(
        "environment",
        r.env_timeout_s,
        "rollout.env_timeout_s",
        memory_mb=r.env_memory_limit_mb,
        memory_field="rollout.env_memory_limit_mb",
    )


@contextmanager
def env_hosts(r: RolloutConfig) -> Iterator[Hosts]:
    """The hosts of one batch's environments on this machine: processes started for it
    (`rollout.env_isolation=process`), or this process (`inline`)."""
    hosts: Hosts = (
        InlineHosts()
        if r.env_isolation == "inline"
        else ProcessHosts(default_workers(r.env_workers), env_policy(r))
    )
    try:
        yield hosts
    finally:
        hosts.close()


class EnvRunners:
    """Where a run's environments live, batch after batch: in the controller (`rollout.env_isolation=inline`),
    in processes started for each batch (`process` with cluster.backend=inline), or in Ray actors started
    on the first batch and kept until `close()` at the end of the run (`process` with cluster.backend=ray;
    `ascent.cluster.ray_hosts`). The runner and the policy are the same for all three; only the hosts differ."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.images = env_image_encoder(
            cfg.model.path, cfg.model.min_pixels, cfg.model.max_pixels
        )  # the model's image codec (None: a text model)
        self.frames_dir = str(Path(cfg.run_dir) / FRAMES)  # simulators that render write frames here
        self._actors: Any = None
        self._lock = threading.Lock()  # the collector's thread and the controller's may both start a batch

    @contextmanager
    def batch(self) -> Iterator[Hosts]:
        """The hosts of one batch's environments."""
        if self.cfg.cluster.backend != "ray" or self.cfg.rollout.env_isolation == "inline":
            with env_hosts(self.cfg.rollout) as hosts:
                yield hosts
        else:
            yield self._ray_actors()

    def _ray_actors(self) -> Any:
        with self._lock:
            if self._actors is None:
                from ascent.cluster.ray_hosts import RayHosts  # deferred: Ray, only for env actors on Ray

                r, c = self.cfg.rollout, self.cfg.cluster
                self._actors = RayHosts(
                    r.env_workers,
                    env_policy(r),
                    cpus_per_host=r.env_cpus,
                    gpus_per_host=r.env_gpus,
                    per_node=r.env_workers_per_node,
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


@dataclass(frozen=True)
class EnvEpisodes:
    """What an env source's episodes are (`rollout.source` env): the environment of rows without an `env`
    column, the cuts at `max_turns` model turns and `max_tokens` response tokens, and `sims_per_worker`:
    simulator copies a host steps together (0: one environment per episode; see `vector_envs`)."""

    env: str
    max_turns: int
    max_tokens: int
    sims_per_worker: int = 0


def vector_envs(tasks: Sequence[Task], hosts: Hosts, copies: int) -> HostedSimEnvs | None:
    """Blocks of `copies` simulator copies stepped through gymnasium's vector API inside the hosts
    (`rollout.source.sims_per_worker`), when every task is an episode of the simulator env `gym`; else None
    (the runner's one environment per episode)."""
    if copies < 1 or any(t.env != "gym" for t in tasks):
        return None
    return HostedSimEnvs(hosts, copies)


def with_frames(row: dict[str, Any], env: str, frames_dir: str) -> dict[str, Any]:
    """The row a simulator episode (env `gym`) plays: with `frames_dir`, where it writes the frames it
    renders (rows with `render`/`image_obs`) for the studio's episode browser; other rows unchanged."""
    return row | {"frames_dir": frames_dir} if env == "gym" else row


def collect_env_groups(
    envs: EnvRunners,
    episodes: EnvEpisodes,
    rollout: WorkerGroup[RolloutWorker],
    tokenizer: Any,
    items: Sequence[Any],
    params: SamplingParams,
    *,
    seed: int,
) -> list[Group]:
    """`params.n` episodes of every item's environment (run in `envs`, each turn sampled on the `rollout`
    replicas) -> one group per item, in order."""
    n = params.n
    names = [env_name(it.metadata, episodes.env) for it in items]
    tasks = [
        Task(name, with_frames(it.metadata, name, envs.frames_dir), it.row_id)
        for it, name in zip(items, names, strict=True)
        for _ in range(n)
    ]

    def generate(requests: list[GenerationRequest]) -> list[list[Generation]]:
        # by request_id, the episode's index: each episode keeps its replica (and its cached history)
        shards, positions = B.shard_requests(requests, rollout.num_workers)
        flat = [g for out in rollout.call_split(RolloutWorker.generate, shards) for g in out.generations]
        return [flat[k] for k in positions]

    with envs.batch() as hosts:
        played = run_episodes(
            tasks,
            generate,
            ChatTokens(tokenizer),
            replace(params, seed=seed),
            max_turns=episodes.max_turns,
            max_tokens=episodes.max_tokens,
            hosts=hosts,
            images=envs.images,
            envs=vector_envs(tasks, hosts, episodes.sims_per_worker),
        )
    return [Group(tuple(played[i * n : (i + 1) * n])) for i in range(len(items))]


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
