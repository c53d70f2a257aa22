"""Data and tiny models for examples/embodied: CartPole seeds and a tiny text checkpoint whose vocabulary
holds the action words `<a0>`, `<a1>` as single tokens (grpo.yaml: their ids are the turn's stop tokens);
with `--vla`, InvertedPendulum seeds seen as rendered frames and a tiny vision-language checkpoint whose
vocabulary holds the 16 action tokens of the pendulum's force bins (vla.yaml: a VLA, frames in, action
tokens out); with `--continuous`, ReachContinuous seeds for a tiny text checkpoint with a continuous action
head (action_head.yaml).

    python examples/embodied/make_data.py runs/embodied    # then: ascent train examples/embodied/grpo.yaml
    python examples/embodied/make_data.py runs/embodied_vla --vla    # then: ascent train .../vla.yaml
    python examples/embodied/make_data.py runs/embodied_action_head --continuous    # then: .../action_head.yaml
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ascent.envs.sim.actions import ActionTokenizer
from ascent.envs.sim.reach import CONTINUOUS_ID
from ascent.envs.tasks.control_task import TASKS, make_control_task
from ascent.models.tiny import make_tiny_checkpoint
from ascent.models.tiny_vl import make_tiny_vl_checkpoint

ACTION_WORDS = ["<a0>", "<a1>"]  # CartPole's two actions (ascent.envs.sim.actions)
VLA_BINS = TASKS["inverted_pendulum"]["bins"]  # the pendulum's force in 16 bins: 16 action tokens
VLA_WORDS = ActionTokenizer(low=(-3.0,), high=(3.0,), bins=VLA_BINS).words


def make(out: Path, rows: int = 64, seed: int = 0, model_seed: int = 0) -> dict[str, object]:
    """Write out/data/{rows,val}.jsonl and out/model; return the stop token ids of the action words."""
    make_control_task(out / "data", rows, seed, n_val=16, task="cartpole")
    model = make_tiny_checkpoint(
        out / "model",
        hidden_size=64,
        num_layers=2,
        words=ACTION_WORDS,
        seed=model_seed,
        max_position_embeddings=1024,
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    ids = [tok.convert_tokens_to_ids(w) for w in ACTION_WORDS] + [tok.eos_token_id]
    (out / "stop_token_ids.json").write_text(json.dumps(ids))
    return {"model": str(model), "stop_token_ids": ids}


def make_vla(out: Path, rows: int = 64, seed: int = 0, model_seed: int = 0) -> dict[str, object]:
    """Write out/data/{rows,val}.jsonl (InvertedPendulum seeds, each step's frame shown as an image) and
    out/model (a tiny Qwen2.5-VL with the action tokens); return the model's path and the tokens' ids."""
    make_control_task(out / "data", rows, seed, n_val=8, task="inverted_pendulum", image_obs=True)
    model = make_tiny_vl_checkpoint(out / "model", words=VLA_WORDS, seed=model_seed)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    return {"model": str(model), "action_token_ids": tok.convert_tokens_to_ids(VLA_WORDS)}


def continuous_rows(seeds: range | list[int]) -> list[dict[str, object]]:
    """ReachContinuous rows, one per seed (the target's side), success when the target is reached; the first
    message is the state alone (`instructions: false`: a model made from scratch cannot read the preamble,
    and it hides the state from its attention)."""
    return [
        {"gym_id": CONTINUOUS_ID, "seed": k, "success_rule": "goal", "instructions": False} for k in seeds
    ]


def make_continuous(out: Path, rows: int = 64, seed: int = 0, model_seed: int = 0) -> dict[str, object]:
    """Write out/data/rows.jsonl (ReachContinuous seeds) and out/model (a tiny text checkpoint; the action
    head is made by the run, `model.action_head`)."""
    (out / "data").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) + "\n" for r in continuous_rows(range(seed, seed + rows))]
    (out / "data" / "rows.jsonl").write_text("".join(lines))
    model = make_tiny_checkpoint(out / "model", hidden_size=64, num_layers=2, seed=model_seed)
    return {"model": str(model), "rows": str(out / "data" / "rows.jsonl")}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=Path("runs/embodied"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vla", action="store_true", help="the VLA's pixel task and VL model (vla.yaml)")
    parser.add_argument("--continuous", action="store_true", help="ReachContinuous (action_head.yaml)")
    args = parser.parse_args()
    maker = make_vla if args.vla else make_continuous if args.continuous else make
    print(maker(args.out, seed=args.seed, model_seed=args.seed))
