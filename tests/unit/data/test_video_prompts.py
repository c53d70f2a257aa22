"""Rows whose messages show a video: the video is decoded at load time into a few evenly spaced frames, each
an image (its pads, its `ImageInput`) after a "Frame i at t s:" marker; a missing, corrupt or badly
configured video costs its row (row number and path), never the run; a URL is refused; a video over
data.max_prompt_tokens names the frame options as the fix."""

from __future__ import annotations

import base64
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from ascent.data import DataError, image_codec, load_prompts, render_sft_examples_and_report
from ascent.data.images import video_frames_of
from tests.unit.video_files import write_video
from tests.unit.vl_files import png_bytes


@pytest.fixture(scope="module")
def vl(vl_processor_dir):
    return AutoTokenizer.from_pretrained(str(vl_processor_dir)), image_codec(str(vl_processor_dir))


def _user(*parts):
    return [{"role": "user", "content": list(parts)}]


def _text(text):
    return {"type": "text", "text": text}


def _load(tmp_path, rows, vl, max_prompt_tokens=2048, name="d.jsonl"):
    tok, codec = vl
    data = tmp_path / name
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_prompts(
        str(data), tok, source="data.train_path", max_prompt_tokens=max_prompt_tokens, codec=codec
    )


def test_a_video_becomes_its_sampled_frames_as_images_with_time_markers(tmp_path, vl):
    _, codec = vl
    (tmp_path / "clips").mkdir()
    write_video(tmp_path / "clips" / "clip.mp4", frames=20, rate=10)  # 2 seconds
    rows = [
        {"prompt": _user({"type": "video", "video": "clips/clip.mp4", "fps": 2}, _text("what moves?"))},
        {"prompt": _user({"type": "video", "video": "clips/clip.mp4", "nframes": 2}, _text("and?"))},
        {"prompt": _user({"type": "video", "video": "clips/clip.mp4"}, _text("default"))},
    ]
    (a, b, c), report = _load(tmp_path, rows, vl)
    clip = str(tmp_path / "clips" / "clip.mp4")
    assert [im.source for im in a.images] == [
        f"{clip} frame {i} at {t} s" for i, t in ((0, "0.0"), (6, "0.6"), (13, "1.3"), (19, "1.9"))
    ]
    assert (
        "Frame 0 at 0.0 s:<|vision_start|><|image_pad|>" in a.prompt_text
        and "Frame 19 at 1.9 s:" in a.prompt_text
    )
    assert a.prompt_ids.count(codec.image_token_id) == sum(im.num_tokens for im in a.images)
    assert [im.source.split(" frame ")[1] for im in b.images] == ["0 at 0.0 s", "19 at 1.9 s"]
    assert len(c.images) == 4  # the default: 2 frames per second
    assert video_frames_of(a.images) == {clip: 4} and len(report.image_tokens) == 10


def test_a_list_of_frame_images_is_a_video_sampled_by_nframes(tmp_path, vl):
    for i in range(5):
        (tmp_path / f"f{i}.png").write_bytes(png_bytes(28, 28, i))
    frames = [f"f{i}.png" for i in range(5)]
    (tmp_path / "gone").mkdir()
    rows = [
        {"prompt": _user({"type": "video", "video": frames, "nframes": 3}, _text("q"))},
        {"prompt": _user({"type": "video", "video": ["f0.png", "gone/f9.png"]}, _text("q"))},
    ]
    (item,), report = _load(tmp_path, rows, vl)
    assert [im.source.rsplit(" ", 2)[1:] for im in item.images] == [
        ["frame", "0"],
        ["frame", "2"],
        ["frame", "4"],
    ]
    assert "Frame 2:<|vision_start|>" in item.prompt_text
    assert report.bad_images[0].startswith(f"row 2: image {tmp_path / 'gone' / 'f9.png'}: no such file")


def test_a_missing_or_corrupt_video_costs_its_row_naming_row_and_path(tmp_path, vl, caplog):
    write_video(tmp_path / "ok.mp4", frames=4, rate=4)
    (tmp_path / "junk.mp4").write_bytes(b"not a video at all" * 10)
    rows = [
        {"prompt": _user({"type": "video", "video": "gone.mp4"})},
        {"prompt": _user({"type": "video", "video": "junk.mp4"})},
        {"prompt": _user({"type": "video", "video": "ok.mp4", "max_frames": 2})},
    ]
    with caplog.at_level(logging.WARNING, logger="ascent"):
        items, report = _load(tmp_path, rows, vl)
    assert [i.row_id for i in items] == [2] and len(items[0].images) == 2
    gone, junk = report.bad_images
    assert gone == (
        f"row 1: video {tmp_path / 'gone.mp4'}: no such file (the row writes 'gone.mp4', resolved against the "
        f"dataset file's folder {tmp_path}); give an absolute path or a path relative to that folder"
    )
    assert junk.startswith(f"row 2: video {tmp_path / 'junk.mp4'}: not a readable video (Invalid data found")
    assert "row 2: video" in caplog.text


def test_bad_sampling_options_are_validation_errors_naming_row_and_option(tmp_path, vl):
    rows = [
        {"prompt": _user({"type": "video", "video": "a.mp4", "max_frames": 0})},
        {"prompt": _user({"type": "video", "video": "a.mp4", "speed": 2})},
        {"prompt": _user({"type": "video", "video": ["a.png", "b.png"], "fps": 1})},
    ]
    with pytest.raises(DataError) as err:
        _load(tmp_path, rows, vl)
    zero, unknown, clockless = err.value.problems
    assert (
        zero
        == f"row 1: field 'prompt' video {tmp_path / 'a.mp4'}: max_frames=0: give a positive whole number."
    )
    assert unknown.endswith(
        "unknown video option 'speed'; the options are fps, nframes, max_frames, max_pixels."
    )
    assert (
        "row 3: field 'prompt' video message 0 part 0 (2 frames): fps=1.0 for a list of frame images"
        in clockless
    )


def test_a_video_url_is_refused_offline(tmp_path, vl):
    rows = [{"prompt": _user({"type": "video", "video": "https://example.com/a.mp4"})}]
    with pytest.raises(DataError, match="names the URL .*ascent never downloads videos"):
        _load(tmp_path, rows, vl)


def test_frames_over_the_prompt_limit_name_the_frame_options(tmp_path, vl):
    write_video(tmp_path / "clip.mp4", frames=8, rate=4)
    rows = [{"prompt": _user({"type": "video", "video": "clip.mp4", "fps": 4}, _text("q"))}]
    with pytest.raises(
        DataError, match=r"8 images: 4, 4, .* show fewer video frames \(8 now: the video part's "
    ):
        _load(tmp_path, rows, vl, max_prompt_tokens=40)


def test_parquet_video_bytes_and_a_data_url(tmp_path, vl):
    tok, codec = vl
    data = write_video(tmp_path / "clip.webm", frames=6, rate=3).read_bytes()
    url = "data:video/webm;base64," + base64.b64encode(data).decode()
    prompt = _user({"type": "video", "video": {"bytes": data, "path": "clip.webm"}, "nframes": 2}, _text("q"))
    pq.write_table(pa.table({"prompt": [prompt]}), tmp_path / "d.parquet")
    (item,), _ = load_prompts(
        str(tmp_path / "d.parquet"), tok, source="d", max_prompt_tokens=512, codec=codec
    )
    assert len(item.images) == 2
    (item,), _ = _load(tmp_path, [{"prompt": _user({"type": "video", "video": url, "max_frames": 3})}], vl)
    assert [im.source for im in item.images][-1] == "message 0 part 0 (data URL) frame 5 at 1.7 s"


def test_sft_conversation_with_a_video(tmp_path, vl):
    tok, codec = vl
    clip = str(write_video(tmp_path / "clip.mp4", frames=4, rate=4))
    rows = [
        {
            "messages": [
                {"role": "user", "content": [{"type": "video", "video": clip, "nframes": 2}, _text("what?")]},
                {"role": "assistant", "content": "red"},
            ]
        }
    ]
    (ex,), _ = render_sft_examples_and_report(rows, tok, max_prompt_tokens=512, codec=codec)
    assert len(ex.images) == 2
    assert ex.prompt_ids.count(codec.image_token_id) == sum(im.num_tokens for im in ex.images)
