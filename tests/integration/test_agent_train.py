"""Training an agent that knows only the OpenAI client, through the run's own endpoint (an agent
`rollout.source`).

The agent (`lookup_agent.run`) plays the lookup game of `lookup_env.py` with `client.chat.completions`: it
asks the model, and when the model asks back (`?`) it appends the reply and the secret as a tool message and
asks again. The run records each call token-exact; the two calls of an episode become one two-turn episode. So
GRPO must learn what it learns through the environment (test_env_learns.py), with the same measure (the exact
expected reward of a temperature-1 episode), and it must show on held-out rows, greedily, through the real
`ascent eval --agent` (the agent against an endpoint served from the checkpoint). The shared warm start
already asks greedily (asking is its likeliest first token), so greedy success could only come from better
copying; the run starts instead from a lazy start (`lazy_start`: the warm start after 3 epochs on 40
demonstrations, three in four answering 7 at once), which greedily answers 7 and wins on one secret in ten.
Measured on one machine over seeds 1-2 in 25 iterations: expected reward 0.318 -> 0.68-0.74 (+0.36 against
the bar of 0.2); greedy accuracy on the held-out file (the secrets 0-9 once each; 5 is never a training row)
0.1 -> 0.7 on both (+0.6 against the bar of 0.3). From the shared warm start the expected reward rose as
much (0.346-0.363 -> 0.71-0.79) but the greedy held-out accuracy stayed at 0.5-0.6 (it asked before and
after).

Then, in-process on a small run: every episode the update received (its ids, loss mask and sampler logprobs)
is the one the experience store holds, token for token, and each is one segment of two calls or one call;
and the run leaves no thread, agent process or endpoint behind (every run here is in-process, like the
learning tests after it in the same pytest process).
"""

from __future__ import annotations

import gc
import json
import logging
import random
import threading
from multiprocessing import active_children
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ascent_here, write_yaml
from tests.integration.lookup_env import conversation, expected_reward, lookup_run

AGENT = "tests.integration.lookup_agent:run"
ITERATIONS, BAR, GREEDY_BAR = 25, 0.2, 0.3
EPISODE = [
    "--max-turns",
    "2",
    "--max-episode-tokens",
    "16",
    "--max-prompt-tokens",
    "16",
    "--max-new-tokens",
    "4",
]


def greedy_eval(model: Path, rows: Path) -> dict[str, float]:
    """`ascent eval --agent` of the lookup agent on `rows` (greedy, as training's episodes are bounded)."""
    out = ascent_here(
        "eval", "--model", str(model), "--data", str(rows), "--agent", AGENT, *EPISODE, "--device", "cpu"
    )
    return {k: float(v) for k, _, v in (x.partition(": ") for x in out.stdout.splitlines()) if v}


@pytest.fixture(scope="module")
def lazy_start(
    lookup_setup: tuple[Path, Path, list[int]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, dict[str, float]]:
    """The lazy start (see the module doc), the held-out rows (the secrets 0-9) and its greedy score on
    them."""
    _, warm, _ = lookup_setup
    root = tmp_path_factory.mktemp("lazy")
    rng = random.Random(1)
    demos = [conversation(rng.randrange(10), i % 4 == 0, 7) for i in range(40)]
    (root / "sft.jsonl").write_text("".join(json.dumps(d) + "\n" for d in demos))
    cfg = {
        "run_dir": str(root / "sft"),
        "epochs": 3.0,
        "batch_size": 8,
        "model": {"path": str(warm)},
        "data": {"train_path": str(root / "sft.jsonl"), "max_prompt_tokens": 16},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 512},
        "tracking": {"progress": False, "tensorboard": False},
    }
    ascent_here("sft", str(write_yaml(root / "sft.yaml", cfg)))
    rows = root / "held_out.jsonl"
    rows.write_text("".join(json.dumps({"secret": s}) + "\n" for s in range(10)))
    return root / "sft" / "final", rows, greedy_eval(root / "sft" / "final", rows)


def live_servers() -> set[int]:
    """The ids of the OpenAI endpoints alive in this process (after a garbage collection)."""
    from ascent.rollout.server import OpenAIServer

    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, OpenAIServer)}


def agent_config(run_dir: Path, data: Path, model: Path, seed: int, iterations: int) -> dict[str, Any]:
    return lookup_run(run_dir, data, model, seed, iterations, agent=AGENT)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_grpo_through_the_endpoint_learns_to_ask(
    seed: int,
    tmp_path: Path,
    lookup_setup: tuple[Path, Path, list[int]],
    lazy_start: tuple[Path, Path, dict[str, float]],
) -> None:
    root, _, secrets = lookup_setup
    start, held_out, greedy_before = lazy_start
    cfg = agent_config(tmp_path / "run", root / "train.jsonl", start, seed=seed, iterations=ITERATIONS)
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    final = sorted((tmp_path / "run" / "checkpoints").glob("iter_*"))[-1]
    before, after = expected_reward(start, secrets), expected_reward(final, secrets)
    assert after > before + BAR, f"seed {seed}: expected reward {before:.3f} -> {after:.3f}"
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["env/turns_mean"] > metrics[1]["env/turns_mean"]  # it asks more often
    assert all(m.get("agent/rewritten_segments", 0) == 0 and m.get("agent/errors", 0) == 0 for m in metrics)
    greedy_after = greedy_eval(final, held_out)
    assert greedy_after["episodes"] == 10 and greedy_after["agent_errors"] == 0
    assert greedy_after["accuracy"] >= greedy_before["accuracy"] + GREEDY_BAR, (
        f"seed {seed}: held-out greedy accuracy {greedy_before['accuracy']:.2f} -> "
        f"{greedy_after['accuracy']:.2f}"
    )


@pytest.mark.slow
def test_the_update_trains_on_what_the_store_holds(
    tmp_path: Path, lookup_setup: tuple[Path, Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ascent.config import load_config
    from ascent.entrypoints.train import run_training
    from ascent.orchestrator import loop
    from ascent.tracking.experience_store import open_store

    root, warm, _ = lookup_setup
    used: list[tuple[int, Any]] = []
    original = loop.update_policy

    def spy(ctx: Any, samples: list[Any], it: int) -> dict[str, float]:
        used.extend((it, s) for s in samples)
        return original(ctx, samples, it)

    monkeypatch.setattr(loop, "update_policy", spy)
    cfg = agent_config(tmp_path / "run", root / "train.jsonl", warm, seed=2, iterations=2)
    package = logging.getLogger("ascent")  # the run adds its log handlers here: leave none to later tests
    handlers, level = list(package.handlers), package.level
    threads, children, servers = {t.ident for t in threading.enumerate()}, active_children(), live_servers()
    try:
        run_training(load_config(str(write_yaml(tmp_path / "run.yaml", cfg))))
    finally:
        for h in package.handlers[len(handlers) :]:
            h.close()
        package.handlers, package.level = handlers, level
    # the endpoint's threads, the agent processes and the server itself end with the run (several trainings
    # may run in one Python process)
    assert {t.ident for t in threading.enumerate()} <= threads
    assert set(active_children()) <= set(children) and live_servers() <= servers
    with open_store(tmp_path / "run") as store:
        stored = [r for r in store.iter_episodes() if r.status in ("trained", "filtered")]
    assert len(stored) == len(used) == 2 * 8 * 8
    two_turn = 0
    for (it, sample), record in zip(used, stored, strict=True):
        assert (it, sample.prompt_ids, sample.response_ids) == (
            record.iteration,
            record.prompt_ids,
            record.response_ids,
        )
        assert sample.sampler_logprobs == record.sampler_logprobs
        if record.status == "trained":
            assert sample.loss_mask == record.loss_mask
        two_turn += 0 in record.loss_mask  # the secret (mask 0) between two sampled turns
    assert two_turn > 0


@pytest.mark.slow
def test_a_plain_agent_scored_by_the_reward_function_and_agent_failures(
    tmp_path: Path, tiny_model: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"secret": s}) + "\n" for s in range(4)))
    cfg = agent_config(tmp_path / "run", rows, tiny_model, seed=0, iterations=1)
    cfg["rollout"]["source"]["agent"] = "tests.integration.lookup_agent:guess_once"
    cfg["rollout"] |= {"prompts_per_step": 2, "samples_per_prompt": 2}
    cfg["train"]["trajectories_per_update"] = 4
    cfg["reward"] = {"fn": "format", "kwargs": {"pattern": "."}}  # any reply scores 1: the function ran
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    (last,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1:]
    assert last["reward/mean"] == 1.0 and last["agent/calls_mean"] == 1.0

    cfg["run_dir"] = str(tmp_path / "long")  # past the context: truncated episodes, not failures (issue #26)
    cfg["rollout"]["source"]["agent"] = "tests.integration.lookup_agent:talks_on"
    ascent_here("train", str(write_yaml(tmp_path / "long.yaml", cfg)))
    (last,) = [json.loads(x) for x in (tmp_path / "long" / "metrics.jsonl").read_text().splitlines()][-1:]
    assert last["agent/truncated"] == 4 and last["agent/errors"] == 0 and last["rollout/truncated_frac"] == 1

    cfg["run_dir"] = str(tmp_path / "bad")
    cfg["rollout"]["source"]["agent"] = "tests.integration.lookup_agent:always_fails"
    out = ascent_here("train", str(write_yaml(tmp_path / "bad.yaml", cfg)), check=False)
    assert out.returncode == 2 and "reward.max_failure_rate=0.05: 4 of 4 agent episodes failed" in out.stderr
    cfg["rollout"]["source"]["agent"] = "tests.integration.lookup_agent:missing"
    out = ascent_here("train", str(write_yaml(tmp_path / "bad.yaml", cfg)), check=False)
    assert (
        out.returncode == 2 and "rollout.source.agent='tests.integration.lookup_agent:missing'" in out.stderr
    )
