"""A run directory as `ascent train` leaves it, built without training: metrics.jsonl, trace.json,
config.yaml and an experience store whose tokenizer decodes every id to a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascent.config import RunConfig, write_resolved_config
from ascent.messages import Episode
from ascent.tracking import EventBus, JsonlSink, Metrics, Timeline
from ascent.transport.store_writer import Entry, ExperienceWriter, prepare_store

WORDS = ["<pad>", "what", "is", "2+2", "?", "call", "calc", "result", "4", "answer", "<eos>"]


def make_tokenizer(out: Path) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    out.mkdir(parents=True, exist_ok=True)
    Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>")).save(
        str(out / "tokenizer.json")
    )
    return out


def multi_turn(row: int, reward: float) -> Episode:
    """prompt `what is 2+2 ?`; model `call calc`, observation `result 4`, model `answer 4 <eos>`."""
    return Episode(
        prompt_ids=[1, 2, 3, 4],
        response_ids=[5, 6, 7, 8, 9, 8, 10],
        sampler_logprobs=[-0.1, -2.5, 0.0, 0.0, -0.3, -0.05, -0.01],
        loss_mask=[1, 1, 0, 0, 1, 1, 1],
        finish_reason="stop",
        row_id=row,
        policy_version=1,
        token_versions=[1, 1, 1, 1, 2, 2, 2],
        reward=reward,
        response_text="call calc answer 4",
        metadata={"turns": 2, "turn_rewards": [0.0, reward]},
    )


def make_run(run_dir: Path, steps: int = 3, iterations: int = 3, episodes: bool = True) -> Path:
    cfg = RunConfig.model_validate({"run_dir": str(run_dir), "iterations": iterations, "train": {"lr": 2e-5}})
    write_resolved_config(cfg, run_dir)
    bus = EventBus([JsonlSink(run_dir)])
    bus.publish(Metrics.of(0, {"val/accuracy": 0.25}))
    for step in range(1, steps + 1):
        bus.publish(
            Metrics.of(
                step,
                {
                    "reward/mean": 0.1 * step,
                    "loss/policy": -0.01 * step,
                    "grad_norm": 1.0 / step,
                    "time/update": 0.5,
                },
            )
        )
    bus.close()
    timeline = Timeline(run_dir / "trace.json")
    for it in range(1, steps + 1):
        with timeline.phase("rollout", iteration=it), timeline.phase("generate"):
            pass
        with timeline.phase("update", iteration=it):
            pass
    timeline.flush()
    if episodes:
        tokenizer = make_tokenizer(run_dir.parent / "tokenizer")
        path = run_dir / "experience.db"
        prepare_store(path, 0, meta={"tokenizer": str(tokenizer)})
        writer = ExperienceWriter(path, decode=lambda ids: " ".join(WORDS[i] for i in ids))
        writer.put(
            [
                Entry(multi_turn(0, 1.0), 1, "trained", 1, group_index=0, env="calc", advantage=0.5),
                Entry(multi_turn(1, 0.0), 2, "dropped_stale", 2, reason="too old", env="calc"),
                Entry(multi_turn(2, 0.5), 2, "trained", 2, group_index=0, env="search"),
            ]
        )
        writer.close()
        assert writer.error is None
    return run_dir


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    make_run(root / "sweep" / "lr1" / "run")
    return root
