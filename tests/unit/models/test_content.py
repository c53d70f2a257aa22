"""Content parts with images, as OpenAI and Hugging Face write them: paths (absolute, relative to the dataset
file), data URLs, an `images` column of bytes; http(s) URLs refused with the fix; bad images named."""

from __future__ import annotations

import base64
import pickle

import pytest

from ascent.models.content import (
    ContentError,
    ImageLoadError,
    ImageRef,
    VideoRef,
    content_problem,
    has_images,
    open_image,
    resolve_paths,
    template_messages,
)
from tests.unit.vl_files import png_bytes


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_parts_become_template_placeholders_and_refs_in_order(tmp_path):
    (tmp_path / "a.png").write_bytes(png_bytes(10, 12))
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Look."}]},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": str(tmp_path / "a.png")},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": _data_url(png_bytes(5, 7, 1))}},
                {"type": "image"},
            ],
        },
    ]
    out, refs = template_messages(messages, [{"bytes": png_bytes(3, 4, 2), "path": "c.png"}])
    assert out[0] == {"role": "system", "content": "Look."}  # text-only parts: one string
    assert [p["type"] for p in out[1]["content"]] == ["image", "text", "image", "image"]
    assert [open_image(r).size for r in refs] == [(12, 10), (7, 5), (4, 3)]
    assert refs[0].source == str(tmp_path / "a.png")
    assert refs[1].source == "message 1 part 2 (data URL)" and refs[2].source == "images[0] (bytes of c.png)"


def test_relative_paths_resolve_against_the_dataset_folder(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "b.png").write_bytes(png_bytes(6, 6))
    row = {
        "prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "imgs/b.png"}}]}],
        "images": ["imgs/b.png", {"bytes": None, "path": "imgs/b.png"}],
    }
    resolve_paths(row, tmp_path)
    assert row["prompt"][0]["content"][0]["image_url"]["url"] == str(tmp_path / "imgs" / "b.png")
    assert row["images"] == [
        str(tmp_path / "imgs" / "b.png"),
        {"bytes": None, "path": str(tmp_path / "imgs/b.png")},
    ]
    _, refs = template_messages(row["prompt"])
    assert open_image(refs[0]).size == (6, 6)


def test_http_urls_are_refused_saying_how_to_fix():
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    problem = content_problem([part])
    assert "never downloads" in problem and "reference it by path" in problem
    with pytest.raises(ContentError, match="never downloads"):
        template_messages([{"role": "user", "content": [part]}])


def test_malformed_parts_and_count_mismatch_are_named():
    assert "use one of text, image, image_url" in content_problem([{"type": "audio"}])
    assert "without image_url.url" in content_problem([{"type": "image_url"}])
    with pytest.raises(ContentError, match="has only 0 entries"):
        template_messages([{"role": "user", "content": [{"type": "image"}]}])
    with pytest.raises(ContentError, match="column has 1 entries but the messages have 0"):
        template_messages([{"role": "user", "content": "hi"}], [b"x"])


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("/nowhere/missing.png", "no such file"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:image/png,abc", "must be base64"),
        (b"not an image", "not a readable image"),
        ("rel/x.png", "relative path"),
    ],
)
def test_unusable_images_raise_naming_them(value, why):
    with pytest.raises(ImageLoadError, match=why) as err:
        open_image(ImageRef(value, "the-source"))
    assert err.value.source == "the-source"


def test_video_parts_parse_to_refs_with_their_options_and_resolve_their_paths(tmp_path):
    row = {
        "prompt": [
            {
                "role": "user",
                "content": [
                    {"type": "video", "video": "clips/a.mp4", "fps": 1.0, "text": None, "image": None},
                    {"type": "video", "video": ["f0.png", "/abs/f1.png"], "nframes": 2},
                    {"type": "text", "text": "what happens?"},
                ],
            }
        ],
        "video": {"video": "b.mp4", "fps": 2},  # the image environment's row field
    }
    resolve_paths(row, tmp_path)
    template, (clip, frames) = template_messages(row["prompt"])
    assert template[0]["content"][:2] == [{"type": "video"}, {"type": "video"}]
    assert isinstance(clip, VideoRef) and clip.value == str(tmp_path / "clips" / "a.mp4")
    assert clip.options == {"fps": 1.0} and clip.source == str(tmp_path / "clips" / "a.mp4")
    assert frames.value == [str(tmp_path / "f0.png"), "/abs/f1.png"] and frames.options == {"nframes": 2}
    assert frames.source == "message 0 part 1 (2 frames)"
    assert row["video"]["video"] == str(tmp_path / "b.mp4")
    assert has_images(row["prompt"])
    with pytest.raises(ImageLoadError, match="videos are read from dataset rows only"):
        open_image(clip)


def test_malformed_video_parts_are_named_with_the_fix():
    assert "a video part without 'video'; give {'type': 'video'" in content_problem([{"type": "video"}])
    assert "empty list of frames" in content_problem([{"type": "video", "video": []}])
    remote = content_problem([{"type": "video", "video": ["a.png", "http://x/b.png"]}])
    assert "names the URL 'http://x/b.png': ascent never downloads videos" in remote


def test_the_image_environments_image_and_frames_paths_resolve_against_the_folder(tmp_path):
    uri = _data_url(png_bytes(2, 2))
    row = {
        "image": "imgs/a.png",
        "frames": ["f0.png", "/abs/f1.png", uri, [[[0, 0, 0]]]],
        "extra_info": {"image": "imgs/b.png"},  # SkyRL's rows keep per-row arguments there
    }
    resolve_paths(row, tmp_path)
    assert row["image"] == str(tmp_path / "imgs" / "a.png") and row["image"].written == "imgs/a.png"
    moved = pickle.loads(
        pickle.dumps(row["image"])
    )  # to the environment processes, knowing how it was written
    assert moved == row["image"] and (moved.written, moved.folder) == ("imgs/a.png", str(tmp_path))
    assert row["frames"] == [str(tmp_path / "f0.png"), "/abs/f1.png", uri, [[[0, 0, 0]]]]
    assert row["extra_info"]["image"] == str(tmp_path / "imgs" / "b.png")
