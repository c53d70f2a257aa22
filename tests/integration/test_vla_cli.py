"""A VLA through the real CLI (issue #29): examples/embodied/vla.yaml's tiny Qwen2.5-VL sees MuJoCo's
InvertedPendulum as rendered frames and answers with action tokens only (rollout.action_token_ids), trained
one iteration with PPO: a critic (reading the frames too) and GAE over the per-step rewards. The example runs
on the fast engine (the reference engine's action tokens: tests/unit/rollout/test_reference.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ascent.envs.sim.actions import ActionTokenizer
from ascent.envs.tasks.control_task import control_rows
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from tests.integration.conftest import ascent, write_yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "embodied" / "vla.yaml"


def _vla_config(tmp_path: Path) -> dict:
    """examples/embodied/vla.yaml on a tiny Qwen2.5-VL and two InvertedPendulum rows of 3 steps, one
    iteration of 2 prompts x 2 samples."""
    from transformers import AutoTokenizer

    words = ActionTokenizer(low=(-3.0,), high=(3.0,), bins=16).words
    model = make_tiny_vl_checkpoint(tmp_path / "model", words=words, hidden_size=32, seed=0)
    ids = AutoTokenizer.from_pretrained(str(model)).convert_tokens_to_ids(words)
    rows = [r | {"max_steps": 3} for r in control_rows("inverted_pendulum", [5, 6], image_obs=True)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg.update(run_dir=str(tmp_path / "run"), iterations=1)
    cfg["model"]["path"] = str(model)
    cfg["data"]["train_path"] = str(tmp_path / "rows.jsonl")
    cfg["rollout"].update(prompts_per_step=2, samples_per_prompt=2, action_token_ids=ids)
    cfg["rollout"]["source"]["max_turns"] = 3
    cfg["train"]["trajectories_per_update"] = 4
    return cfg


def _episodes(tmp_path: Path) -> list[dict]:
    """The run's episodes, checked: every turn is an action, each episode stepped until the pole fell or
    the 3 steps ran out (reward 1 each)."""
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").open()]
    assert len(episodes) == 4 and all(e["finish"] == "stop" for e in episodes)
    assert all(1 <= e["reward"] <= 3 for e in episodes), [e["reward"] for e in episodes]
    return episodes


def test_a_vla_plays_from_frames_with_action_tokens_and_trains_with_gae(tmp_path: Path) -> None:
    """On the example's fast engine (eager on the CPU): action tokens masked in its sampler, and each turn
    after an episode's first reuses the K/V of its earlier frames and actions (the episode's session)."""
    cfg = _vla_config(tmp_path)
    cfg["algorithm"].update(advantage={"name": "gae", "gamma": 0.9, "lam": 0.95}, critic_lr=1e-3)
    ascent("train", str(write_yaml(tmp_path / "vla.yaml", cfg)))

    _episodes(tmp_path)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    (trained,) = [m for m in metrics if "env/success_rate" in m]
    assert trained["env/episode_length"] >= 1 and trained["env/turns_mean"] > 1
    assert any("critic" in k for k in metrics[-1]), sorted(metrics[-1])
    # a later turn's prompt is the earlier turn's prompt, its action and the new frame: the earlier prompt's
    # K/V are reused, so every episode computes about its last prompt only, not every prompt it sent
    prompt, reused = trained["rollout/prompt_tokens"], trained["rollout/prefix_reused_tokens"]
    assert 0 < reused < prompt, (reused, prompt)
