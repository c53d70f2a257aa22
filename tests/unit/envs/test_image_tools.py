"""The image tools' arithmetic: bounding boxes read as pixels or fractions, validated, clamped and grown;
crops that hold exactly the pixels asked for, upscaled; frame selection; images read from a row."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from ascent.envs.rows import UnusableRowError, unusable_row
from ascent.envs.tools.image_tools import (
    MIN_SIDE,
    ImageToolError,
    data_uri,
    load_image,
    pick_frames,
    pixel_box,
    zoom,
)
from ascent.models.content import ResolvedPath


def test_fractions_and_pixels_name_the_same_box() -> None:
    assert pixel_box([0, 0, 0.5, 0.25], 400, 200) == (0, 0, 200, 50)
    assert pixel_box([0, 0, 200, 50], 400, 200) == (0, 0, 200, 50)
    assert pixel_box([10.2, 20.7, 99.5, 80.1], 400, 200) == (10, 20, 100, 81)  # whole pixels, outward


def test_a_box_over_the_edge_is_clamped_and_a_tiny_one_grows_inside_the_image() -> None:
    assert pixel_box([-50, 150, 120, 900], 400, 200) == (0, 150, 120, 200)
    assert pixel_box([100, 100, 102, 101], 400, 200) == (93, 92, 93 + MIN_SIDE, 92 + MIN_SIDE)
    assert pixel_box([398, 0, 399, 3], 400, 200) == (400 - MIN_SIDE, 0, 400, MIN_SIDE)  # shifted inside
    assert pixel_box([0, 0, 5, 5], 10, 10) == (0, 0, 10, 10)  # an image smaller than MIN_SIDE: all of it


@pytest.mark.parametrize(
    ("bbox", "message"),
    [
        ([1, 2, 3], "four finite numbers"),
        ([0, 0, float("nan"), 1], "four finite numbers"),
        ([0.5, 0, 0.2, 1], "x1 < x2 and y1 < y2"),
        ([0, 10, 50, 10], "x1 < x2 and y1 < y2"),
        ([500, 0, 600, 100], "outside the image"),
    ],
)
def test_a_bad_box_is_a_sentence_for_the_model(bbox: list[float], message: str) -> None:
    with pytest.raises(ImageToolError, match=message):
        pixel_box(bbox, 400, 200)


def test_zoom_crops_exactly_the_box_and_upscales_it() -> None:
    pixels = np.zeros((100, 200, 3), dtype=np.uint8)
    pixels[20:40, 50:90] = (255, 0, 0)  # a red block; the rest black
    image = Image.fromarray(pixels)
    out = zoom(image, (50, 20, 90, 40), longest=200)
    assert out.size == (200, 100)
    assert (np.asarray(out) == (255, 0, 0)).all()
    assert zoom(image, (0, 0, 200, 100), longest=50).size == (200, 100)  # never shrunk


def test_frames_are_picked_in_order_without_repeats_and_bounded() -> None:
    assert pick_frames(8, [5, 1, 5], limit=4) == [5, 1]
    with pytest.raises(ImageToolError, match="no frame 8: the sequence has frames 0 to 7"):
        pick_frames(8, [2, 8], limit=4)
    with pytest.raises(ImageToolError, match="no frame -1"):
        pick_frames(8, [-1], limit=4)
    with pytest.raises(ImageToolError, match="5 frames asked; at most 4"):
        pick_frames(8, [0, 1, 2, 3, 4], limit=4)
    with pytest.raises(ImageToolError, match="give the frames"):
        pick_frames(8, [], limit=4)


def test_an_image_loads_from_a_data_uri_a_file_or_pixels(tmp_path) -> None:
    pixels = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    image = Image.fromarray(pixels)
    image.save(tmp_path / "x.png")
    for value in (data_uri(image), str(tmp_path / "x.png"), pixels.tolist(), image):
        assert (np.asarray(load_image(value)) == pixels).all()
    with pytest.raises(ValueError, match="image='nope.png': no such image file"):
        load_image("nope.png")
    with pytest.raises(ValueError, match=r"frames\[2\]: expected a path, a data URI or RGB pixels"):
        load_image([1, 2, 3], "frames[2]")


def test_a_missing_or_unreadable_image_is_the_rows_problem_named_with_its_folder(tmp_path) -> None:
    with pytest.raises(
        UnusableRowError,
        match=r"image='imgs/a.png': no such image file \(resolved against "
        f"the dataset file's folder {tmp_path}",
    ):
        load_image(ResolvedPath("imgs/a.png", tmp_path))
    (tmp_path / "bad.png").write_text("not a png")
    with pytest.raises(UnusableRowError, match="frames\\[1\\]=.*bad.png': not a readable image"):
        load_image(str(tmp_path / "bad.png"), "frames[1]")
    with pytest.raises(UnusableRowError, match=r"image=\(data URI\): not a readable image"):
        load_image("data:image/png;base64,AAAA")
    failure = f"{UnusableRowError.__name__}: image='x.png': no such image file"
    assert unusable_row(failure) == "image='x.png': no such image file"
    assert unusable_row("ValueError: no frame 12") is None and unusable_row(([], None)) is None
