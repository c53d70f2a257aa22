"""`ascent sft`'s train samples: a conversation's loss mask (assistant turns only) and the images its ids
show reach the trainer."""

from __future__ import annotations

from ascent.data.sft import SFTExample
from ascent.entrypoints.sft import sft_samples
from ascent.messages import ImageInput


def test_masks_and_images_reach_the_train_samples():
    image = ImageInput(pixel_values=None, grid_thw=(1, 4, 4), num_tokens=4, digest="d", source="a.png")
    pair = SFTExample([1, 2], [3, 4], row_id=0)
    chat = SFTExample([1, 6, 6, 6, 6], [3, 5, 4], row_id=1, loss_mask=[1, 0, 1], images=(image,))
    plain, vision = sft_samples([pair, chat])
    assert plain.loss_mask == [1, 1] and plain.images == () and plain.advantages == [1.0, 1.0]
    assert vision.loss_mask == [1, 0, 1] and vision.images == (image,)
