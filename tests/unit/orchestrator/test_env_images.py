"""Images in the loop's environment path: the image encoder is a vision-language checkpoint's codec (none for a
text model), and the episodes' images reach the trainer's samples. An image environment's rows (`zoom_qa`):
relative image paths are relative to the dataset file, a row whose image is missing is left out naming its
row and path (the others are kept), and a row over data.max_prompt_tokens is named with its image tokens."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from PIL import Image

from ascent.config import load_config
from ascent.config.schema import RunConfig
from ascent.data import load_rows
from ascent.envs.runner import EnvResetError
from ascent.errors import AscentError
from ascent.messages import Episode, ImageInput
from ascent.models import make_tiny_checkpoint
from ascent.models.loading import load_tokenizer
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from ascent.models.vision import ImageCodec, ImageCodecError, image_token_id
from ascent.orchestrator.batch import train_samples
from ascent.orchestrator.episodes import env_image_encoder, env_items
from ascent.orchestrator.setup import build_datasets
from tests.unit.vl_files import png_bytes


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


def zoom_rows(folder: Path, images: list[str]) -> Path:
    """`folder`/rows.jsonl: a zoom_qa row per image path (as written), the images that exist beside it."""
    (folder / "imgs").mkdir(parents=True)
    for i in range(8):
        (folder / "imgs" / f"{i}.png").write_bytes(png_bytes(56, 56, seed=i))
    rows = [{"prompt": "What is it?", "answer": "a", "image": image} for image in images]
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "rows.jsonl"


def zoom_cfg(model: Path, data: Path, *overrides: str) -> RunConfig:
    source = "rollout.source={name: env, env: zoom_qa, max_turns: 2}"
    limit = "data.max_prompt_tokens=1024"  # the system prompt, the question and a 4-token image fit
    return load_config(None, [f"model.path={model}", f"data.train_path={data}", source, limit, *overrides])


def test_a_zoom_qa_row_with_a_missing_image_is_left_out_and_relative_paths_follow_the_data(
    tmp_path, monkeypatch, caplog, vl_processor_dir
) -> None:
    images = [f"imgs/{i}.png" for i in range(8)]
    data = zoom_rows(tmp_path / "data", [*images[:3], "imgs/missing.png", *images[3:]])
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # not the data's folder: its paths still resolve there
    cfg = zoom_cfg(vl_processor_dir, data, "rollout.env_isolation=inline")
    with caplog.at_level(logging.WARNING, logger="ascent"):
        items, report = env_items(load_rows(data), load_tokenizer(vl_processor_dir), "zoom_qa", cfg, "data")
    assert [it.row_id for it in items] == [0, 1, 2, 4, 5, 6, 7, 8]  # the images beside the data file
    assert report.kept == 8 and report.dropped == 1 and len(report.bad_images) == 1
    folder = (tmp_path / "data").resolve()
    expected = (
        f"row 4: zoom_qa.reset: image='imgs/missing.png': no such image file (resolved against the dataset "
        f"file's folder {folder}: {folder / 'imgs' / 'missing.png'}); give a path relative to the dataset file"
    )
    assert report.bad_images[0].startswith(expected)
    assert any(r.getMessage().startswith(f"data {expected}") for r in caplog.records)
    assert "1 left out for an unusable image (first: row 4" in report.summary()


def test_with_every_image_missing_no_usable_prompts_names_the_cause(tmp_path, vl_processor_dir) -> None:
    data = zoom_rows(tmp_path / "data", ["imgs/gone.png", "imgs/gone.png"])
    with pytest.raises(
        AscentError,
        match=r"no usable training prompts \(0/2 prompts kept.*2 left out for an "
        r"unusable image \(first: row 1: zoom_qa.reset: image='imgs/gone.png'",
    ):
        build_datasets(zoom_cfg(vl_processor_dir, data, "rollout.env_isolation=inline"))


def test_an_over_long_image_row_names_its_image_tokens_and_the_fix(
    tmp_path, caplog, vl_processor_dir
) -> None:
    data = zoom_rows(tmp_path / "data", ["imgs/0.png"])
    cfg = zoom_cfg(vl_processor_dir, data, "rollout.env_isolation=inline", "data.max_prompt_tokens=20")
    with caplog.at_level(logging.WARNING, logger="ascent"):
        items, report = env_items(load_rows(data), load_tokenizer(vl_processor_dir), "zoom_qa", cfg, "data")
    assert not items and report.dropped == 1
    problem = report.overlong_images[0]
    assert problem.startswith("row 1: the prompt is ") and "4 of them image tokens (1 images: 4)" in problem
    assert problem.endswith(
        "over data.max_prompt_tokens=20; lower model.max_pixels (fewer tokens per image) "
        "or raise data.max_prompt_tokens"
    )
    assert any(problem in r.getMessage() for r in caplog.records)


def test_an_image_the_processor_refuses_costs_its_row_but_a_text_model_stops_the_run(
    tmp_path, vl_processor_dir
) -> None:
    data = zoom_rows(tmp_path / "data", ["imgs/0.png", "imgs/thin.png"])
    Image.new("RGB", (600, 2)).save(tmp_path / "data" / "imgs" / "thin.png")  # aspect ratio over 200
    cfg = zoom_cfg(vl_processor_dir, data, "rollout.env_isolation=inline")
    items, report = env_items(load_rows(data), load_tokenizer(vl_processor_dir), "zoom_qa", cfg, "data")
    assert [it.row_id for it in items] == [0] and len(report.bad_images) == 1
    assert report.bad_images[0].startswith(
        "row 2: its prompt's images: UnusableRowError: row 2 image 0: the "
    )
    assert "aspect ratio" in report.bad_images[0]
    text = zoom_cfg(make_tiny_checkpoint(tmp_path / "text"), data, "rollout.env_isolation=inline")
    with pytest.raises(EnvResetError, match="row 1: its prompt's images: ImagesWithoutEncoderError"):
        env_items(load_rows(data), load_tokenizer(vl_processor_dir), "zoom_qa", text, "data")
