"""`model.action_head`: the example config validates, and what the head is not wired into is refused with
the field, its value and the fix (the CLI exits 2 on ConfigError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascent.config import ConfigError, load_config
from ascent.orchestrator.specs import action_head_spec, engine_spec, trainer_spec

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "embodied" / "action_head.yaml"


def test_the_example_builds_the_head_spec_for_trainer_and_engine() -> None:
    cfg = load_config(EXAMPLE)
    spec = action_head_spec(cfg.model)
    assert spec is not None and (spec.dim, spec.chunk, spec.init_std, spec.token_id) == (1, 2, 0.5, 0)
    assert trainer_spec(cfg, 10).action_head == spec == engine_spec(cfg).action_head
    assert action_head_spec(load_config(None, []).model) is None
    assert load_config(EXAMPLE, ["rollout.engine=fast"]).rollout.engine == "fast"  # the fast engine acts too


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("rollout.engine=fast,rollout.tensor_parallel=2", ["rollout.tensor_parallel=2", "tensor_parallel=1"]),
        ("model.lora.rank=4", ["model.lora.rank=4", "model.lora.rank=0"]),
        ("algorithm.kl_loss_coef=0.1", ["kl_loss_coef=0.1", "set both to 0"]),
        ("train.sharding=fsdp", ["train.sharding='fsdp'", "train.sharding=none"]),
        ("replay.store=x.db", ["replay.store='x.db'", "replay.store to null"]),
    ],
)
def test_what_the_head_does_not_support_is_refused_with_the_fix(override: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, override.split(","))
    text = "\n".join(info.value.problems)
    assert all(n in text for n in names), text
    assert "model.action_head is set" in text


def test_a_single_turn_run_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.action_head.dim=1"])
    text = "\n".join(info.value.problems)
    assert "rollout.source=prompt" in text and "rollout.source.name=env" in text, text


def test_a_head_needs_a_positive_dimension() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, ["model.action_head.dim=0"])
    assert "model.action_head.dim" in "\n".join(info.value.problems)
