"""`reward.group_hooks` through `ascent train`: an environment with a tool, Pixel-Reasoner's curiosity bonus
and a difficulty filter; every trained episode's `curiosity` component (in the experience store) is the
bonus computed by hand from its group's tool calls, and the metrics log the component and the filter."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from ascent.tracking.experience_store import open_store
from tests.integration.conftest import ascent_here, run_config, write_yaml


def test_curiosity_and_a_filter_shape_a_run_on_a_tool_environment(tmp_path: Path, tiny_model: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(4)))
    cfg = run_config(tmp_path, tiny_model, data, iterations=1, val_every=0)
    cfg["data"].pop("val_path")
    cfg["rollout"] |= {
        "source": {
            "name": "env",
            "env": "tests.integration.tool_env:ToolProbe",
            "max_turns": 3,
            "max_episode_tokens": 24,
        },
        "env_isolation": "inline",
        "stop_token_ids": list(range(4, 40)),  # every ordinary character ends a turn
    }
    curiosity = {"name": "curiosity", "target_rate": 1.0, "alpha": 1.0, "beta": 0.5, "max_calls": 1}
    cfg["reward"] = {"group_hooks": [{"name": "difficulty_filter", "low": 0.0, "high": 1.0}, curiosity]}
    cfg["train"]["max_tokens_per_micro_batch"] = 64
    cfg["tracking"] |= {"tensorboard": False, "trace": False}
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))

    with open_store(tmp_path / "run") as store:
        trained = [r for r in store.episodes() if r.status == "trained"]
    groups = defaultdict(list)
    for r in trained:
        groups[r.iteration, r.group_index].append(r)
    assert len(groups) == 2 and all(len(g) == 4 for g in groups.values())
    calls = [r.metadata["tool_calls"] for r in trained]
    assert any(calls) and not all(calls)  # the tool was called, and not every time
    for group in groups.values():
        rate = sum(r.metadata["tool_calls"] > 0 for r in group) / len(group)
        for r in group:
            n = r.metadata["tool_calls"]
            expected = (1.0 - rate) * (n > 0) - 0.5 * max(n - 1, 0)
            assert abs(r.reward_components["curiosity"] - expected) < 1e-9
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/curiosity/mean" in m]
    assert len(steps) == 1 and steps[0]["reward/difficulty_filter/dropped_groups"] == 0.0
    parts = [r.reward_components["curiosity"] for r in trained]
    assert abs(steps[0]["reward/curiosity/mean"] - sum(parts) / len(parts)) < 1e-6
