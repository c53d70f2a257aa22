"""Where episodes come from: one protocol, three sources, chosen once at setup (`run.build_run`).

A source starts a batch of tasks (`submit`: one group per item, `params.n` episodes each), scores what it
collected (`score`), and plays a validation batch (`evaluate`). `PromptSource`: single-turn prompts sampled
on the rollout replicas (the call returns at once; the groups are ready when `result()` is asked) and scored
with the reward function. `EnvSource`: an environment's episodes, one engine call per turn, rewarded by the
environment. `AgentSource`: the user's agent played through the run's endpoint, rewarded by the agent (or
the reward function on its last reply). The collector and the validation never ask which one they have.

A multi-turn source plays a batch submitted `ahead` (for a later iteration) on a thread of the controller
when the replicas generate beside the trainer (`alongside`), so it plays while the trainer updates;
otherwise, and for the current iteration, it plays when submitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from ascent.cluster.base import WorkerGroup
from ascent.messages import Group, SamplingParams
from ascent.orchestrator.agents import AgentPlays
from ascent.orchestrator.episodes import EnvEpisodes, EnvRunners, collect_env_groups, env_metrics
from ascent.orchestrator.sampling import RolloutStats, Scorer, Submitted, finish, generate, submit
from ascent.orchestrator.workers import RolloutWorker

Batch = tuple[list[Group], RolloutStats]


class Pending(Protocol):
    """A batch being collected: `result()` waits for its groups and their stats."""

    def result(self) -> Batch: ...


class EpisodeSource(Protocol):
    """What the collector and the validation sample from (see the module docstring)."""

    def submit(self, items: list[Any], params: SamplingParams, seed: int, *, ahead: bool = False) -> Pending:
        """Start a batch of `params.n` episodes per item; `ahead`: for a later iteration."""
        ...

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        """The collected groups with their rewards, and the batch's reward metrics."""
        ...

    def evaluate(self, items: Sequence[Any], params: SamplingParams, seed: int) -> list[Group]:
        """A validation batch, played now: one group per item, rewards set."""
        ...

    def close(self) -> None:
        """Stop what the source started (episodes played ahead, environment actors, the agent endpoint)."""
        ...


class _Generating:
    """Single-turn generation in flight on the replicas."""

    def __init__(self, submitted: Submitted, scorer: Scorer) -> None:
        self.submitted, self.scorer = submitted, scorer

    def result(self) -> Batch:
        return finish(self.submitted, self.scorer.decode)


class PromptSource:
    """Single-turn prompts: sampled on the `rollout` replicas, scored by the reward function (`scorer`)."""

    def __init__(self, rollout: WorkerGroup[RolloutWorker], scorer: Scorer) -> None:
        self.rollout, self.scorer = rollout, scorer

    def submit(self, items: list[Any], params: SamplingParams, seed: int, *, ahead: bool = False) -> Pending:
        return _Generating(submit(self.rollout, items, params, seed=seed), self.scorer)

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        return self.scorer(groups)

    def generate(self, items: list[Any], params: SamplingParams, *, seed: int) -> list[Group]:
        """Groups of `items` sampled now with the replicas' current weights, not scored (ReMax's baseline)."""
        return generate(self.rollout, self.scorer.decode, list(items), params, seed=seed)

    def evaluate(self, items: Sequence[Any], params: SamplingParams, seed: int) -> list[Group]:
        return self.scorer(self.generate(list(items), params, seed=seed))[0]

    def close(self) -> None:
        pass


def _done(out: Batch) -> Future[Batch]:
    done: Future[Batch] = Future()
    done.set_result(out)
    return done


class _MultiTurn:
    """What the environment and agent sources share: playing ahead on a thread, and their reward metrics
    (reward/mean|std, env/*; more failed episodes than `max_failure_rate` allows stop the run)."""

    def __init__(self, max_failure_rate: float, alongside: bool) -> None:
        self.max_failure_rate, self.alongside = max_failure_rate, alongside
        self._thread: ThreadPoolExecutor | None = None

    def play(self, items: list[Any], params: SamplingParams, seed: int) -> Batch:
        raise NotImplementedError

    def submit(self, items: list[Any], params: SamplingParams, seed: int, *, ahead: bool = False) -> Pending:
        if ahead and self.alongside:
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="ascent-collector")
            return self._thread.submit(self.play, items, params, seed)
        return _done(self.play(items, params, seed))

    def score(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        return groups, env_metrics(groups, self.max_failure_rate)  # the episodes came with their rewards

    def close(self) -> None:
        """Wait for episodes being played ahead, drop the ones not started."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
            self._thread = None


class EnvSource(_MultiTurn):
    """An environment's episodes (`rollout.source.env`), run in `envs`, each turn sampled on the `rollout`
    replicas."""

    def __init__(
        self,
        envs: EnvRunners,
        episodes: EnvEpisodes,
        rollout: WorkerGroup[RolloutWorker],
        tokenizer: Any,
        max_failure_rate: float,
        alongside: bool,
    ) -> None:
        super().__init__(max_failure_rate, alongside)
        self.envs, self.episodes, self.rollout, self.tokenizer = envs, episodes, rollout, tokenizer

    def play(self, items: list[Any], params: SamplingParams, seed: int) -> Batch:
        return self.evaluate(items, params, seed), RolloutStats(engine_idle_s=0.0)

    def evaluate(self, items: Sequence[Any], params: SamplingParams, seed: int) -> list[Group]:
        return collect_env_groups(
            self.envs, self.episodes, self.rollout, self.tokenizer, items, params, seed=seed
        )

    def close(self) -> None:
        super().close()
        self.envs.close()


class AgentSource(_MultiTurn):
    """The user's agent (`rollout.source.agent`) played through the run's endpoint (`AgentPlays`)."""

    def __init__(self, agents: AgentPlays, max_failure_rate: float, alongside: bool) -> None:
        super().__init__(max_failure_rate, alongside)
        self.agents = agents

    def play(self, items: list[Any], params: SamplingParams, seed: int) -> Batch:
        groups, stats = self.agents.play(items, params)
        return groups, RolloutStats(0.0, stats.metrics(self.max_failure_rate))

    def evaluate(self, items: Sequence[Any], params: SamplingParams, seed: int) -> list[Group]:
        return self.agents.play(items, params)[0]

    def close(self) -> None:
        super().close()
        self.agents.close()
