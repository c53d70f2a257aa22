"""The reward model: a tiny Qwen2ForSequenceClassification scores text pairs in packed batches."""

from __future__ import annotations

import pytest
import torch

from ascent.models.tiny import make_tiny_reward_model
from ascent.orchestrator.workers import RewardModelWorker
from ascent.trainer.reward_model import RewardModel, RewardModelError, RewardModelSpec

PAIRS = [("What is 2+3?", "5"), ("Say hi", "hello there, friend"), ("x", "y" * 40), ("2*4=?", "8")]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return make_tiny_reward_model(tmp_path_factory.mktemp("rm") / "tiny_rm", seed=1)


@pytest.fixture(scope="module")
def rm(rm_dir):
    return RewardModel(RewardModelSpec(path=str(rm_dir), device="cpu", max_tokens_per_batch=64))


def test_scores_are_deterministic_and_batched_equals_one_at_a_time(rm):
    batched = rm.score(PAIRS)
    assert rm.score(PAIRS) == batched
    alone = [rm.score([pair])[0] for pair in PAIRS]
    assert batched == pytest.approx(alone, abs=1e-5)
    assert len(set(batched)) == len(PAIRS)  # the texts are told apart


def test_a_score_is_what_transformers_pools_from_the_whole_model(rm):
    """The packed forward reads the head at each sequence's last token, as the model's own forward does."""
    for pair, score in zip(PAIRS, rm.score(PAIRS), strict=True):
        logits = rm.model(input_ids=torch.tensor([rm.encode(*pair)])).logits
        assert logits.shape == (1, 1)
        assert score == pytest.approx(logits.item(), abs=1e-5)


def test_the_chat_template_formats_the_pair(rm, rm_dir):
    ids = rm.encode("hi", "yo")
    text = rm.tokenizer.decode(ids)
    assert text.index("hi") < text.index("yo") and "<|im_start|>" in text
    raw = RewardModel(RewardModelSpec(path=str(rm_dir), device="cpu", chat_template=False))
    assert raw.tokenizer.decode(raw.encode("hi", "yo")) == "hiyo"


def test_the_worker_scores_through_the_model(rm_dir):
    worker = RewardModelWorker(RewardModelSpec(path=str(rm_dir), device="cpu"))
    assert worker.score(PAIRS[:2]) == pytest.approx(
        RewardModel(RewardModelSpec(path=str(rm_dir), device="cpu")).score(PAIRS[:2]), abs=1e-6
    )


def test_a_checkpoint_with_several_labels_is_refused(tmp_path, rm_dir):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        str(rm_dir), num_labels=3, ignore_mismatched_sizes=True
    )
    model.save_pretrained(str(tmp_path))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((rm_dir / name).read_bytes())
    with pytest.raises(RewardModelError, match="num_labels=3"):
        RewardModel(RewardModelSpec(path=str(tmp_path), device="cpu"))
