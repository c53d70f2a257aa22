"""Data and a tiny model for examples/embodied/grpo.yaml: CartPole seeds, and a tiny checkpoint whose
vocabulary holds the action words `<a0>`, `<a1>` as single tokens (their ids are the turn's stop tokens).

    python examples/embodied/make_data.py runs/embodied    # then: ascent train examples/embodied/grpo.yaml
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ascent.envs.tasks.control_task import make_control_task
from ascent.models.tiny import make_tiny_checkpoint

ACTION_WORDS = ["<a0>", "<a1>"]  # CartPole's two actions (ascent.envs.sim.actions)


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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=Path("runs/embodied"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make(args.out, seed=args.seed, model_seed=args.seed))
