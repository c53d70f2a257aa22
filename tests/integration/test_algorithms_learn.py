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

Measured on the shared 2-core machine, gains of seeds 1, 2, 3 on its own vector ISA (AVX-512; the warm
start's expected reward is 0.044) and under ATEN_CPU_CAPABILITY=avx2 (another CPU's rounding: the same
SFT lands at 0.297 there, so the runs start elsewhere and have less to gain):
                     AVX-512                 AVX2
  grpo+ppo           +0.387 +0.437 +0.365    +0.363 +0.163 +0.372
  rloo               +0.405 +0.409 +0.347    +0.379 +0.363 +0.275
  reinforce_pp+kl    +0.546 +0.515 +0.626    +0.411 +0.380 +0.368
  remax              +0.244 +0.294 +0.496    +0.196 +0.224 +0.312
  dapo               +0.417 +0.529 +0.585    +0.390 +0.370 +0.270
  gae+critic         +0.622 +0.437 +0.481    +0.357 +0.383 +0.275
  grpo+gspo          +0.240 +0.381 +0.413    +0.111 +0.212 +0.267
  grpo+cispo         +0.201 +0.463 +0.189    +0.244 +0.354 +0.285
(AVX-512, seed 4: remax +0.473, gspo +0.477, cispo +0.361.) The smallest mean is gspo's +0.197 under AVX2
against BAR = 0.1 (2x; +0.284 on AVX-512), the smallest seed gspo's seed 1 under AVX2, +0.111, against
WORST_BAR = 0.05 (2.2x). At 8 iterations a seed fell to +0.119 on AVX-512 (cispo's seed 3), hence 10. The
earlier design (one seed, 20 iterations of two 32-trajectory steps, bar +0.15) rose +0.44 to +0.75 on the
AVX-512 seeds measured, but asserted one seed only; its 8-iteration form left grpo+ppo's seed 1 at +0.09
(too few steps), so the steps are halved in size instead: as many episodes, twice the steps. Cost: about
1 s a seed after the first run of the process (0.2 s of it fixed), about 2.5x the single-seed CPU time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ascent_here, write_yaml

VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
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
SEEDS, ITERATIONS, BAR, WORST_BAR = (1, 2, 3), 10, 0.1, 0.05


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
    cfg: dict[str, Any] = {
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
