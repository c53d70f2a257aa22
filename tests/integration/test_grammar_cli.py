"""`ascent train` with `rollout.grammar`: every sampled turn follows the grammar, and the trainer scores the
sampler's tokens as it sampled them (logprobs of the unconstrained distribution on both sides), with the
tokens the grammar forced out of the loss."""

from __future__ import annotations

import json
import re
import sqlite3

from conftest import ascent_here, run_config, write_yaml

GRAMMAR = 'start: ("7" | "8") /[0-9]/'  # two digits, the first a 7 or an 8; then only end-of-turn


def test_every_sampled_turn_follows_the_grammar(tmp_path, tiny_model, arithmetic_data):
    over = {"rollout.grammar": GRAMMAR, "iterations": 2, "val_every": 0, "rollout.val_samples_per_prompt": 1}
    cfg = write_yaml(tmp_path / "run.yaml", run_config(tmp_path, tiny_model, arithmetic_data, **over))
    ascent_here("train", str(cfg))
    run = tmp_path / "run"
    with sqlite3.connect(run / "experience.db") as db:
        rows = list(db.execute("select response_text, response_ids, loss_mask from episodes"))
    texts = [t for t, _, _ in rows]
    assert len(texts) == 2 * 2 * 4
    # the untrained tiny model writes anything: here only what the grammar allows, then its end of turn
    for text in texts:
        assert re.fullmatch(r"[78][0-9](<\|[a-z_]+\|>)?", text), text
    # the two digits were choices (of 2, then of 10); the end of turn after them was the only token allowed
    for _, ids, mask in rows:
        assert list(mask) == [1, 1, 0][: len(ids) // 4], (list(mask), len(ids))
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if "reward/mean" in m]
    assert train and all(m["rollout/logprob_diff_max"] < 1e-3 for m in train)
    assert "val/accuracy" in metrics[-1]  # validation ran (under the grammar too: batch.sampling_params)
