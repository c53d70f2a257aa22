"""The loop's side of the experience store (`ascent.tracking.experience_store`): every episode an iteration
sampled, with what became of it.

`recording` opens the store for a run (keeping the iterations up to the one it starts after, so a resumed run
drops what it samples again) and closes it however the run ends; `record_left_out` records the groups a
stage of `Collector.collect` took out (stale, without reward signal, surplus); `record_trained` the groups the
update used, with their advantages (episodes that `algorithm.filter_zero_advantage` took out of the loss
count as filtered). Each call only queues frozen episodes; decoding and disk writes happen on the writer's
thread, which decodes with its own copy of the tokenizer.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascent.config.schema import RunConfig
from ascent.config.sources import AgentSourceConfig, EnvSourceConfig
from ascent.messages import Episode, Group, TrainSample, flatten
from ascent.orchestrator.episodes import env_name
from ascent.tracking.experience_store import FILE_NAME
from ascent.transport.store_writer import Decode, Entry, ExperienceWriter, prepare_store

log = logging.getLogger("ascent")
ZERO_ADVANTAGE = "zero_advantage: every advantage is 0 (algorithm.filter_zero_advantage)"


@dataclass(frozen=True)
class ExperienceLog:
    """Where the loop records episodes: the store's `writer` (None: `tracking.experience_store` is off, and
    recording does nothing), and what labels an entry: the run's agent (its import path) or environment
    (a row's own `env` column wins), None for single-turn runs; whether zero-advantage episodes are
    filtered."""

    writer: ExperienceWriter | None
    agent: str | None = None
    env: str | None = None
    filter_zero_advantage: bool = False


@dataclass(frozen=True)
class ExperienceSpec:
    """What `recording` is built from, taken from the config once at setup (`of`): the store's file (None:
    `tracking.experience_store` is off), the tokenizer it names, and the labels of `ExperienceLog`."""

    path: str | None
    tokenizer: str
    agent: str | None = None
    env: str | None = None
    filter_zero_advantage: bool = False

    @classmethod
    def of(cls, cfg: RunConfig) -> ExperienceSpec:
        source = cfg.rollout.source
        return cls(
            str(Path(cfg.run_dir) / FILE_NAME) if cfg.tracking.experience_store else None,
            cfg.model.tokenizer_path or cfg.model.path,
            source.agent if isinstance(source, AgentSourceConfig) else None,
            source.env if isinstance(source, EnvSourceConfig) else None,
            cfg.algorithm.filter_zero_advantage,
        )


@contextmanager
def recording(spec: ExperienceSpec, tokenizer: Any, start: int) -> Iterator[ExperienceLog]:
    """Record the episodes of iterations `start + 1 ..` in the store (`spec.path`) through the log this
    yields; the writer is closed however the run ends."""
    if spec.path is None:
        yield ExperienceLog(None, spec.agent, spec.env)
        return
    prepare_store(Path(spec.path), keep_through=start, meta={"tokenizer": spec.tokenizer})
    writer = ExperienceWriter(Path(spec.path), decode=_decoder(tokenizer))
    try:
        yield ExperienceLog(writer, spec.agent, spec.env, spec.filter_zero_advantage)
    finally:
        writer.close()


def _decoder(tokenizer: Any) -> Decode:
    """Decoding for the writer's thread, on a copy of the tokenizer (the loop keeps using its own)."""
    try:
        tok = copy.deepcopy(tokenizer)
    except Exception as err:  # a tokenizer that does not copy: share it (decoding does not change it)
        log.debug("experience store: the tokenizer does not copy (%s); sharing it", err)
        tok = tokenizer
    return lambda ids: tok.decode(list(ids), skip_special_tokens=False)


def record_left_out(
    log: ExperienceLog, it: int, before: Sequence[Group], after: Sequence[Group], status: str, reason: str
) -> None:
    """Record the groups of `before` that a stage left out of `after` (compared by identity)."""
    if log.writer is None:
        return
    kept = {id(g) for g in after}
    left = [e for g in before if id(g) not in kept for e in g.episodes]
    log.writer.put(
        Entry(e, it, status, trainer_version=it - 1, reason=reason, env=_env(log, e)) for e in left
    )


def record_trained(
    log: ExperienceLog, it: int, groups: Sequence[Group], samples: Sequence[TrainSample]
) -> None:
    """Record the groups the update of iteration `it` used; `samples` are their train samples (advantages
    set, masks as the update sees them), one per episode of `flatten(groups)`."""
    if log.writer is None:
        return
    place = [g for g, group in enumerate(groups) for _ in group.episodes]
    filtering = log.filter_zero_advantage
    entries = []
    for g, e, s in zip(place, flatten(groups), samples, strict=True):
        filtered = filtering and any(e.loss_mask) and not any(s.loss_mask)
        entries.append(
            Entry(
                e,
                it,
                "filtered" if filtered else "trained",
                trainer_version=it - 1,
                group_index=g,
                reason=ZERO_ADVANTAGE if filtered else None,
                env=_env(log, e),
                advantage=_mean_advantage(e, s),
            )
        )
    log.writer.put(entries)


def _mean_advantage(e: Episode, s: TrainSample) -> float | None:
    """The mean advantage over the episode's loss-mask tokens (all tokens when none has mask 1)."""
    values = list(itertools.compress(s.advantages, e.loss_mask)) or s.advantages
    return sum(values) / len(values) if values else None


def _env(log: ExperienceLog, e: Episode) -> str | None:
    """The environment an episode ran in (as `env_name` chose it), or the agent's import path; None for
    single-turn reward runs."""
    if log.agent is not None:
        return log.agent
    return None if log.env is None else env_name(e.metadata, log.env)
