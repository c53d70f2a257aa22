"""Images in the loop's environment path: the image encoder is a vision-language checkpoint's codec (none for a
text model), and the episodes' images reach the trainer's samples."""

from __future__ import annotations

import pytest

from ascent.messages import Episode, ImageInput
from ascent.models import make_tiny_checkpoint
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from ascent.models.vision import ImageCodec, ImageCodecError, image_token_id
from ascent.orchestrator.batch import train_samples
from ascent.orchestrator.episodes import env_image_encoder


def test_a_vision_language_checkpoint_gives_its_codec_a_text_one_none(tmp_path) -> None:
    vl = make_tiny_vl_checkpoint(tmp_path / "vl")
    codec = env_image_encoder(str(vl))
    assert isinstance(codec, ImageCodec) and codec.image_token_id == image_token_id(vl)
    assert env_image_encoder(str(make_tiny_checkpoint(tmp_path / "text"))) is None


def test_a_vision_checkpoint_without_its_processor_is_refused_with_the_fix(tmp_path) -> None:
    vl = make_tiny_vl_checkpoint(tmp_path / "vl")
    (vl / "preprocessor_config.json").unlink()
    with pytest.raises(ImageCodecError, match="point model.path at a Qwen2.5-VL/Qwen3-VL directory"):
        env_image_encoder(str(vl))


def test_train_samples_keep_the_episodes_images() -> None:
    image = ImageInput(pixel_values=None, grid_thw=(1, 2, 2), num_tokens=1, digest="d")
    episode = Episode([1, 6], [2], [-0.1], [1], "stop", row_id=0, images=(image,))
    assert train_samples([episode])[0].images == (image,)
