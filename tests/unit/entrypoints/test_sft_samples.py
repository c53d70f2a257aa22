"""`ascent sft`'s train samples: a conversation's loss mask (assistant turns only) and the images its ids
show reach the trainer, and its loss and nll are per token of the model's turns (issue #28)."""

from __future__ import annotations

import pytest

from ascent.data.sft import SFTExample
from ascent.entrypoints.sft import masked_nll, sft_samples, sft_step
from ascent.messages import ImageInput, TrainSample


def test_masks_and_images_reach_the_train_samples():
    image = ImageInput(pixel_values=None, grid_thw=(1, 4, 4), num_tokens=4, digest="d", source="a.png")
    pair = SFTExample([1, 2], [3, 4], row_id=0)
    chat = SFTExample([1, 6, 6, 6, 6], [3, 5, 4], row_id=1, loss_mask=[1, 0, 1], images=(image,))
    plain, vision = sft_samples([pair, chat])
    assert plain.loss_mask == [1, 1] and plain.images == () and plain.advantages == [1.0, 1.0]
    assert vision.loss_mask == [1, 0, 1] and vision.images == (image,)


class _Trainer:
    """Two ranks that record what `update` was told and report a policy loss."""

    num_workers = 2

    def __init__(self) -> None:
        self.calls: list[tuple[list[list[TrainSample]], dict]] = []

    def call_split(self, method, shards, **kwargs):
        self.calls.append((shards, kwargs))
        return [{"loss/policy": 0.5}, {"loss/policy": 0.7}]


def _conversation(mask: list[int]) -> TrainSample:
    r = len(mask)
    return TrainSample(prompt_ids=[1, 2], response_ids=[3] * r, loss_mask=mask, advantages=[1.0] * r)


def test_the_sft_nll_is_per_token_of_the_model_turns():
    """A conversation's tool results and image pads (mask 0) must not dilute the reported nll: with 74
    response tokens of which 10 are the model's, dividing by 74 reported 10/74 of the true nll (issue #28).
    The loss keeps its recorded scale (all response tokens)."""
    trainer = _Trainer()
    batch = [_conversation([1] * 6 + [0] * 64 + [1] * 4), _conversation([1, 1, 0])]
    metrics = sft_step(trainer, batch)
    ((shards, kwargs),) = trainer.calls
    assert kwargs == {"total_tokens": 77.0, "total_seqs": 2.0} and sum(map(len, shards)) == 2
    assert metrics["loss/policy"] == pytest.approx(0.6)
    assert metrics["sft/nll"] == pytest.approx(0.6 * 77 / 12)


def test_the_validation_nll_counts_the_masked_tokens_only():
    logprobs = [[-1.0, -50.0, -3.0], [-2.0]]
    assert masked_nll(logprobs, [[1, 0, 1], [1]]) == pytest.approx(2.0)
    assert masked_nll([], []) == 0.0
