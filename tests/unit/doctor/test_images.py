"""The doctor's image check: the pixel budget and image tokens per image (min / median / max) of a
vision-language run, the rows whose images the run would leave out, and images shown to a text model."""

from __future__ import annotations

import json
from pathlib import Path

from ascent.config.schema import RunConfig
from ascent.doctor.images import check_images
from tests.unit.video_files import write_video
from tests.unit.vl_files import UNIT, png_bytes


def _rows(tmp_path: Path, images: list[str]) -> str:
    rows = [
        {"prompt": [{"role": "user", "content": [{"type": "image", "image": name}]}], "answer": "a"}
        for name in images
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cfg(model: Path, data: str, **model_fields) -> RunConfig:
    return RunConfig.model_validate(
        {"model": {"path": str(model), **model_fields}, "data": {"train_path": data}}
    )


def test_budget_and_tokens_per_image_are_shown(tmp_path, vl_processor_dir):
    for name, (h, w) in {"s.png": (20, 20), "m.png": (112, 112), "l.png": (600, 600)}.items():
        (tmp_path / name).write_bytes(png_bytes(h, w))
    data = _rows(tmp_path, ["s.png", "m.png", "l.png"])
    result = check_images(_cfg(vl_processor_dir, data))
    assert result.status == "ok", result
    assert f"pixel budget {4 * UNIT}..{64 * UNIT} pixels (preprocessor_config.json)" in result.detail
    tokens = result.data["image_tokens"]
    assert tokens[0] == 4 and tokens[1] == 16 and 32 <= tokens[2] <= 64
    assert f"over 3 images of the first 3 rows: min 4, median 16, max {tokens[2]}" in result.detail
    tight = check_images(_cfg(vl_processor_dir, data, max_pixels=8 * UNIT, min_pixels=UNIT))
    assert "(model.min_pixels/max_pixels)" in tight.detail and max(tight.data["image_tokens"]) <= 8


def test_bad_image_rows_are_named_and_images_over_the_prompt_budget_warned(tmp_path, vl_processor_dir):
    (tmp_path / "ok.png").write_bytes(png_bytes(600, 600))
    result = check_images(_cfg(vl_processor_dir, _rows(tmp_path, ["ok.png", "gone.png"])))
    assert (
        result.status == "warn"
        and f"1 rows with an unusable image: row 2: image {tmp_path / 'gone.png'}" in result.detail
    )
    assert "leaves these rows out" in result.fix
    over = RunConfig.model_validate(
        {
            "model": {"path": str(vl_processor_dir)},
            "data": {"train_path": _rows(tmp_path, ["ok.png"]), "max_prompt_tokens": 8},
        }
    )
    result = check_images(over)
    assert (
        result.status == "warn"
        and "over data.max_prompt_tokens=8" in result.detail
        and "model.max_pixels" in result.fix
    )


def test_images_shown_to_a_text_model_fail(tmp_path, tiny_dir):
    result = check_images(_cfg(tiny_dir, _rows(tmp_path, ["x.png"])))
    assert (
        result.status == "fail" and "row 1 shows images" in result.detail and "vision-language" in result.fix
    )


def test_a_row_whose_text_and_images_pass_the_limit_is_named(tmp_path, vl_processor_dir):
    (tmp_path / "m.png").write_bytes(png_bytes(112, 112))  # 16 image tokens: alone under the limit
    result = check_images(
        RunConfig.model_validate(
            {
                "model": {"path": str(vl_processor_dir)},
                "data": {"train_path": _rows(tmp_path, ["m.png", "m.png"]), "max_prompt_tokens": 18},
            }
        )
    )
    assert result.status == "warn" and result.data["over_rows"] == [1, 2]
    assert "2 rows over data.max_prompt_tokens=18: row 1 is " in result.detail
    assert "16 of them image tokens (and 1 more)" in result.detail and "lower model.max_pixels" in result.fix


def test_a_text_tokenizer_for_the_vision_language_model_fails(tmp_path, vl_processor_dir, tiny_dir):
    (tmp_path / "m.png").write_bytes(png_bytes(112, 112))
    c = _cfg(vl_processor_dir, _rows(tmp_path, ["m.png"]), tokenizer_path=str(tiny_dir))
    result = check_images(c)
    assert result.status == "fail" and result.detail.startswith(f"model.tokenizer_path={str(tiny_dir)!r}")
    assert "not an image token" in result.detail and "unset model.tokenizer_path" in result.fix


def test_videos_are_counted_as_frames_and_their_image_tokens(tmp_path, vl_processor_dir):
    write_video(tmp_path / "clip.mp4", frames=20, rate=10, size=(56, 56))  # 2 s; 4 image tokens a frame
    rows = [
        {"prompt": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4", **options}]}]}
        for options in ({"fps": 2}, {"nframes": 2}, {"fps": 1, "nframes": 2})
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = check_images(_cfg(vl_processor_dir, str(path)))
    assert result.status == "warn" and result.data["video_frames"] == [4, 2]
    assert (
        "6 of the images are frames of 2 videos: 2..4 frames and 8..16 image tokens per video"
        in result.detail
    )
    assert "row 3: video message 0 part 0" not in result.detail  # a resolved path names the video
    assert f"1 rows with an unusable image: row 3: video {tmp_path / 'clip.mp4'}: fps=1 and nframes=2" in (
        result.detail
    )
    tight = RunConfig.model_validate(
        {"model": {"path": str(vl_processor_dir)}, "data": {"train_path": str(path), "max_prompt_tokens": 12}}
    )
    assert "show fewer video frames (a video part's max_frames" in check_images(tight).fix


def _env_cfg(model: Path, rows: list[dict], folder: Path, **data_fields) -> RunConfig:
    """An image environment's run (zoom_qa) over `rows`, written to `folder`/train.jsonl."""
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = {"train_path": str(folder / "train.jsonl"), **data_fields}
    source = {"name": "env", "env": "zoom_qa", "max_turns": 2}
    return RunConfig.model_validate(
        {"model": {"path": str(model)}, "data": data, "rollout": {"source": source}}
    )


def test_an_image_environments_rows_report_their_image_tokens_and_unusable_rows(
    tmp_path, monkeypatch, vl_processor_dir
):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(png_bytes(112, 112))  # 16 image tokens
    (tmp_path / "imgs" / "b.png").write_bytes(png_bytes(56, 56))  # 4
    q = {"prompt": "What is it?", "answer": "a"}
    rows = [
        {**q, "image": "imgs/a.png"},
        {**q, "frames": ["imgs/b.png", "imgs/a.png"]},
        {**q, "image": "imgs/gone.png"},
        {"prompt": "2+2=", "answer": "4", "env": "python_math"},  # names no image: not this check's
    ]
    monkeypatch.chdir(vl_processor_dir)  # relative paths follow the data file, not the current directory
    result = check_images(_env_cfg(vl_processor_dir, rows, tmp_path))
    assert result.status == "warn", result
    assert f"pixel budget {4 * UNIT}..{64 * UNIT} pixels" in result.detail
    assert "over 3 images of the first 4 rows: min 4, median 16, max 16" in result.detail
    assert result.data["image_tokens"] == [16, 4, 16] and result.data["over_rows"] == []
    assert (
        "1 rows with an unusable image: row 3: image='imgs/gone.png': no such image file (resolved against "
        f"the dataset file's folder {tmp_path}" in result.detail
    )
    assert "leaves these rows out" in result.fix
    over = check_images(_env_cfg(vl_processor_dir, rows[:2], tmp_path, max_prompt_tokens=40))
    assert over.status == "warn" and over.data["over_rows"] == [1, 2]
    assert (
        "2 rows over data.max_prompt_tokens=40: row 1 is" in over.detail
        and "16 of them image tokens" in over.detail
    )
    assert "lower model.max_pixels" in over.fix and "raise data.max_prompt_tokens" in over.fix


def test_an_image_environment_without_images_is_skipped_and_a_broken_reset_fails(tmp_path, vl_processor_dir):
    plain = check_images(_env_cfg(vl_processor_dir, [{"prompt": "2+2=", "answer": "4"}], tmp_path))
    assert plain.status == "skipped" and "none of the first 1 rows names an image" in plain.detail
    both = {"prompt": "q", "answer": "a", "frames": [[[[0, 0, 0]]]], "video": "v.mp4"}
    broken = check_images(_env_cfg(vl_processor_dir, [both], tmp_path))
    assert broken.status == "fail" and "row 1: zoom_qa.reset failed" in broken.detail
    assert "both 'frames' and 'video'" in broken.detail and "ascent debug env" in broken.fix
