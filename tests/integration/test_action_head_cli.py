"""An action-head policy through the real CLI (issue #29): examples/embodied/action_head.yaml's tiny model
acts in ReachContinuous with a continuous action head (model.action_head), two GRPO iterations in process.
The sampler's log-probability of each action equals the trainer's recomputation (the logged mismatch), the
head's weights move, are saved with the checkpoint and reach the engine: on the reference engine and on the fast
one (its head at prefill, ascent/rollout/fast/action.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from ascent.envs.sim.reach import CONTINUOUS_ID
from ascent.models.action_head import HEAD_FILE
from tests.integration.conftest import ascent_here, write_yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "embodied" / "action_head.yaml"


def config(tmp_path: Path, model: Path, **rollout: object) -> dict:
    rows = [{"gym_id": CONTINUOUS_ID, "seed": k, "success_rule": "goal"} for k in (1, 2)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg.update(run_dir=str(tmp_path / "run"), iterations=2, checkpoint={"every": 1})
    cfg["model"]["path"] = str(model)
    cfg["data"]["train_path"] = str(tmp_path / "rows.jsonl")
    cfg["rollout"].update(prompts_per_step=2, samples_per_prompt=2, **rollout)
    cfg["train"]["trajectories_per_update"] = 4
    return cfg


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_an_action_head_acts_in_a_continuous_simulator_and_trains(
    tmp_path: Path, tiny_model: Path, engine: str
) -> None:
    cfg = config(tmp_path, tiny_model, engine=engine)
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))

    run = tmp_path / "run"
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").open()]
    assert len(episodes) == 8 and all(e["finish"] == "stop" for e in episodes)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    trained = [m for m in metrics if "rollout/logprob_diff_max" in m]
    assert len(trained) == 2, metrics
    # the sampler's action log-probabilities are the trainer's; in iteration 2 that holds only if the engine
    # acted with the head the first update moved (published with the policy's weights)
    assert all(m["rollout/logprob_diff_max"] < 1e-4 for m in trained), trained
    assert all(0 <= m["env/success_rate"] <= 1 for m in trained)
    if engine == "fast":  # an episode's next turn reuses its session's K/V (the placeholder token included)
        assert all(m["rollout/prefix_reused_tokens"] > 0 for m in trained), trained
    assert trained[0]["train/optimizer_steps"] == 1.0  # the first groups' rewards differ (random actions)
    head = load_file(str(run / "checkpoints/iter_000001" / HEAD_FILE))
    assert head["mean_proj.weight"].abs().max() > 1e-3  # zero at the start: the update moved it
    assert abs(head["log_std"].item() - math.log(0.5)) > 1e-3  # action_head.init_std: 0.5
