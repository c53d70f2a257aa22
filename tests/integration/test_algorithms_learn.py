"""Each advantage estimator and policy loss raises the reward of a warm-started tiny model on 1-digit
addition.

One SFT warm-start is shared by the session; every variant then runs a short `ascent train` through the real
CLI on a fixed set of 8 prompts and must end with a policy whose expected exact-match reward is clearly
higher than the warm start's. The expected reward is computed exactly, not sampled: the probability that a
temperature-1 sample is the answer followed by EOS, from a teacher-forced forward of the final checkpoint,
averaged over the 8 prompts. (The earlier version compared sampled rewards of the first and last iterations:
sampling noise plus a 2e-3 learning rate made it pass or fail with the CPU's float rounding.)

Each variant runs three seeds (1, 2, 3) of 10 iterations, each of 8 x 8 episodes and four optimizer steps
of 16 trajectories, and must raise the expected reward by more than BAR on average over the seeds and by
more than WORST_BAR on its worst seed: learning is asserted over seeds, not on one seed's luck with this
CPU's rounding. A policy that does not learn keeps the warm start's expected reward (a gain of 0).

Measured on the shared 2-core machine (the warm start's expected reward is 0.044), gains of seeds 1, 2, 3:
  grpo+ppo +0.387 +0.437 +0.365    rloo +0.405 +0.409 +0.347    reinforce_pp+kl +0.546 +0.515 +0.626
  remax +0.244 +0.294 +0.496       dapo +0.417 +0.529 +0.585    gae+critic +0.622 +0.437 +0.481
  grpo+gspo +0.240 +0.381 +0.413   grpo+cispo +0.201 +0.463 +0.189
(seed 4: remax +0.473, gspo +0.477, cispo +0.361). The smallest mean is cispo's +0.284 against BAR = 0.15
(0.13 of room, about the spread of its seeds), the smallest seed cispo's seed 3, +0.189, against
WORST_BAR = 0.07 (2.7x the bar). At 8 iterations the worst seed was +0.119 (cispo) and remax's seed 2
+0.149: too close to a per-seed bar of 0.15, hence 10 iterations and the bar on the mean. The earlier
design (one seed, 20 iterations of two 32-trajectory steps) rose +0.44 to +0.75 on the seeds measured,
but asserted one seed only; its 8-iteration form left grpo+ppo's seed 1 at +0.09 (too few steps), so the
steps are halved in size instead: as many episodes, twice the steps. Cost: about 1 s a seed after the
first run of the process (0.2 s of it fixed), about 2.5x the single-seed CPU time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ascent_here, write_yaml

VARIANTS = {
    "grpo+ppo": {"algorithm": {"advantage": "grpo", "policy_loss": "ppo"}},
    "rloo": {"algorithm": {"advantage": "rloo"}},
    "reinforce_pp+kl_penalty": {"algorithm": {"advantage": "reinforce_pp", "kl_penalty_coef": 0.05}},
    "remax": {"algorithm": {"advantage": "remax"}},
    "dapo": {
        "algorithm": {
            "advantage": "grpo",
            "clip_ratio_high": 0.28,
            "dynamic_sampling": True,
            "overlong_buffer": 1,
            "loss_aggregation": "token-mean",
        }
    },
    "gae+critic": {"algorithm": {"advantage": {"name": "gae", "lam": 0.95}, "critic_lr": 1e-3}},
    "grpo+gspo": {"algorithm": {"advantage": "grpo", "policy_loss": "gspo"}},
    "grpo+cispo": {"algorithm": {"advantage": "grpo", "policy_loss": "cispo"}},
}
SEEDS, ITERATIONS, BAR, WORST_BAR = (1, 2, 3), 10, 0.15, 0.07


def expected_reward(model_dir, prompts) -> float:
    """Mean over prompts of P(response == answer + EOS) under the model at temperature 1 (teacher-forced)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    total = 0.0
    for row in prompts:
        text = tok.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        answer = tok(str(row["answer"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + answer])).logits[0, len(prompt) - 1 : -1]
        total += logits.log_softmax(-1).gather(1, torch.tensor(answer)[:, None]).sum().exp().item()
    return total / len(prompts)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory, arithmetic_data: Path) -> Path:
    """The 8 training prompts every variant runs on."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join((arithmetic_data / "train.jsonl").read_text().splitlines(keepends=True)[:8]))
    return path


@pytest.fixture(scope="module")
def start_reward(warm_model: Path, prompts: Path) -> float:
    """The warm start's expected reward on the prompts (once, not per variant and seed)."""
    return expected_reward(warm_model, [json.loads(line) for line in prompts.read_text().splitlines()])


def gain(name: str, seed: int, run_dir: Path, warm_model: Path, prompts: Path, start: float) -> float:
    """One `ascent train` of variant `name` at `seed` -> its final policy's expected reward minus `start`."""
    cfg = {
        "run_dir": str(run_dir),
        "seed": seed,
        "iterations": ITERATIONS,
        "model": {"path": str(warm_model)},
        "data": {"train_path": str(prompts), "max_prompt_tokens": 32},
        "rollout": {"prompts_per_step": 8, "samples_per_prompt": 8, "max_new_tokens": 4},
        "train": {"lr": 1e-3, "trajectories_per_update": 16, "max_tokens_per_micro_batch": 1024},
        "tracking": {"progress": False, "tensorboard": False, "trace": False},
    }
    for section, values in VARIANTS[name].items():
        cfg.setdefault(section, {}).update(values)
    ascent_here("train", str(write_yaml(run_dir.with_suffix(".yaml"), cfg)))
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    final = sorted((run_dir / "checkpoints").glob("iter_*"))[-1]
    return expected_reward(final, rows) - start


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_improves_reward(
    name: str, tmp_path: Path, warm_model: Path, prompts: Path, start_reward: float
) -> None:
    gains = [gain(name, s, tmp_path / f"run{s}", warm_model, prompts, start_reward) for s in SEEDS]
    report = f"{name}: expected reward {start_reward:.3f} + gains per seed {SEEDS}: " + ", ".join(
        f"{g:+.3f}" for g in gains
    )
    print(report)
    assert sum(gains) / len(gains) > BAR, report
    assert min(gains) > WORST_BAR, report
