"""examples/embodied: its config validates and its stop tokens are the action words of the model it makes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ascent.config.loader import load_config
from ascent.models.tiny import DEFAULT_CHARS, make_char_tokenizer

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "embodied"


def test_the_example_config_validates_and_names_the_action_words(tmp_path):
    cfg = load_config(str(EXAMPLE / "grpo.yaml"))
    source = cfg.rollout.source
    assert source.name == "env" and source.env == "gym" and source.max_turns == 20
    spec = importlib.util.spec_from_file_location("embodied_make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # by path: examples/arithmetic has a make_data module too
    ACTION_WORDS = module.ACTION_WORDS
    tok = make_char_tokenizer(
        tmp_path, DEFAULT_CHARS, ACTION_WORDS
    )  # the vocabulary make_data.py's model has
    assert list(cfg.rollout.stop_token_ids) == [tok.convert_tokens_to_ids(w) for w in ACTION_WORDS]
