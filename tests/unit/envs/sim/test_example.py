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


def test_the_vla_config_validates_and_its_action_tokens_are_the_vla_models(tmp_path):
    cfg = load_config(str(EXAMPLE / "vla.yaml"))
    assert cfg.rollout.source.env == "gym" and cfg.rollout.max_new_tokens == 1
    spec = importlib.util.spec_from_file_location("embodied_make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from ascent.models.tiny_vl import VISION_TOKENS

    tok = make_char_tokenizer(tmp_path, DEFAULT_CHARS, module.VLA_WORDS, special=VISION_TOKENS)
    assert cfg.rollout.action_token_ids == tok.convert_tokens_to_ids(module.VLA_WORDS)
    assert len(module.VLA_WORDS) == module.VLA_BINS == 16
