"""`ascent sft` honours the data options `ascent train` reads: data.overlong_prompts, data.truncation_side,
data.max_val_prompts and data.processors (before: its loader ignored all four, silently).

Each run is one inline SFT of a few pairs on the tiny model; what the options did shows in the steps taken
(one pair per step) and in the final `val/nll`, which for the same trained weights depends only on the
validation pairs that were kept and how they were cut.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ascent_here, write_yaml

MAX_PROMPT = 16  # tokens; the tiny tokenizer's template adds 5 to a string prompt's characters
SHORT = [{"prompt": f"{i}+1=", "response": str(i + 1)} for i in range(4)]
LONG = [{"prompt": f"{i}+" + "1+" * 12 + "0=", "response": str(i + 12)} for i in range(2)]  # 33 tokens


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _sft(tmp_path: Path, model: Path, name: str, check: bool = True, **data: Any) -> Any:
    """`ascent sft` of one pair per step for one epoch into tmp_path/name, `data` the data section."""
    cfg = {
        "run_dir": str(tmp_path / name),
        "epochs": 1.0,
        "batch_size": 1,
        "model": {"path": str(model)},
        "data": {"max_prompt_tokens": MAX_PROMPT, "shuffle": False, **data},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 64},
        "tracking": {"progress": False, "tensorboard": False},
    }
    return ascent_here("sft", str(write_yaml(tmp_path / f"{name}.yaml", cfg)), check=check)


def _last(tmp_path: Path, name: str) -> dict[str, float]:
    """The run's last metrics line (its `step` is the number of optimizer steps: one pair each)."""
    return json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[-1])


def test_overlong_pairs_are_dropped_truncated_or_refused_as_data_overlong_prompts_says(tmp_path, tiny_model):
    train = _jsonl(tmp_path / "train.jsonl", [*SHORT[:3], LONG[0]])
    _sft(tmp_path, tiny_model, "drop", train_path=train)  # the default, as before: the long pair left out
    assert _last(tmp_path, "drop")["step"] == 3
    _sft(tmp_path, tiny_model, "truncate", train_path=train, overlong_prompts="truncate")
    assert _last(tmp_path, "truncate")["step"] == 4  # before: 3, the long pair dropped all the same
    refused = _sft(tmp_path, tiny_model, "error", check=False, train_path=train, overlong_prompts="error")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"data.train_path={train}" in refused.stderr
    assert f"row 4: prompt is 33 tokens, over data.max_prompt_tokens={MAX_PROMPT}" in refused.stderr


def test_validation_pairs_are_cut_from_data_truncation_side_and_limited_by_max_val_prompts(
    tmp_path, tiny_model
):
    """The same training (short pairs only) gives the same weights in every run, so `val/nll` tells which
    validation tokens were scored: a long prompt cut from the right scores as its first 16 tokens given as
    `prompt_ids` (which win over its text), and `max_val_prompts=2` scores as a file of those two rows alone."""
    from ascent.data.prompts import row_prompt
    from ascent.models.loading import load_tokenizer

    tok = load_tokenizer(str(tiny_model))
    train = _jsonl(tmp_path / "train.jsonl", SHORT)
    val = _jsonl(tmp_path / "val.jsonl", LONG)
    cut = [{**r, "prompt_ids": row_prompt(r, tok, chat_template=True)[0][:MAX_PROMPT]} for r in LONG]
    extra = [{"prompt": "9+9=", "response": "18"}, {"prompt": "8+1=", "response": "9"}]
    common = {"train_path": train, "overlong_prompts": "truncate"}
    _sft(tmp_path, tiny_model, "left", val_path=val, **common)  # truncation_side=left is the default
    _sft(tmp_path, tiny_model, "right", val_path=val, truncation_side="right", **common)
    by_ids = _jsonl(tmp_path / "cut.jsonl", [*cut, *extra])
    _sft(tmp_path, tiny_model, "ids", val_path=by_ids, max_val_prompts=2, **common)
    left, right, ids = (_last(tmp_path, name)["val/nll"] for name in ("left", "right", "ids"))
    assert right == pytest.approx(ids, rel=1e-6)  # before: every validation pair dropped, the run refused
    assert left != pytest.approx(right, rel=1e-3)


def test_training_pairs_go_through_data_processors(tmp_path, tiny_model):
    rows = [{**r, "rate": i / 4} for i, r in enumerate(SHORT)]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    keep = [{"name": "difficulty", "column": "rate", "low": 0.5}]  # rates 0.5 and 0.75: 2 of 4 pairs
    _sft(tmp_path, tiny_model, "kept", train_path=train, processors=keep)
    assert _last(tmp_path, "kept")["step"] == 2  # before: 4, every pair trained on
    none = [{"name": "difficulty", "column": "rate", "low": 0.9}]
    refused = _sft(tmp_path, tiny_model, "none", check=False, train_path=train, processors=none)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "data.processors[0] (difficulty) kept none of 4 rows" in refused.stderr
