"""Videos as sampled frames (`ascent.envs.video`): which frames the options pick (evenly spread, first and
last included, capped), the options' errors with the fix, decoding real files written here (an MP4 whose
header counts its frames, a WebM whose header does not), shrinking within max_pixels, and the reasons a
video cannot be read."""

from __future__ import annotations

import base64

import pytest
from PIL import Image

from ascent.envs.video import (
    DEFAULT_MAX_FRAMES,
    VideoError,
    VideoSampling,
    fit_pixels,
    frame_indices,
    read_video,
    sampling,
    sequence_indices,
    video_frames,
)
from tests.unit.video_files import frame_red, red, write_video


def test_frame_indices_follow_fps_nframes_and_the_cap() -> None:
    assert frame_indices(20, 10.0, VideoSampling(fps=2.0)) == [0, 6, 13, 19]  # 2 s at 2 per second
    assert frame_indices(20, 10.0, VideoSampling()) == [0, 6, 13, 19]  # the default is 2 per second
    assert frame_indices(20, 10.0, VideoSampling(fps=0.1)) == [0]  # at least one frame
    assert frame_indices(20, 10.0, VideoSampling(nframes=3)) == [0, 10, 19]
    assert frame_indices(4, 10.0, VideoSampling(nframes=9)) == [0, 1, 2, 3]  # never more than the clip has
    long = frame_indices(3000, 30.0, VideoSampling(fps=30.0))  # 100 s: capped at the default
    assert len(long) == DEFAULT_MAX_FRAMES and long[0] == 0 and long[-1] == 2999
    assert len(frame_indices(3000, 30.0, VideoSampling(nframes=40))) == 40  # nframes says how many
    assert frame_indices(3000, 30.0, VideoSampling(nframes=40, max_frames=5)) == [0, 750, 1500, 2249, 2999]
    assert sequence_indices(9, VideoSampling(max_frames=3)) == [0, 4, 8]


def test_options_errors_name_the_option_and_the_fix() -> None:
    assert sampling({"fps": 1, "max_frames": 4, "max_pixels": None}) == VideoSampling(fps=1.0, max_frames=4)
    cases = {
        "unknown video option 'start'; the options are fps, nframes, max_frames, max_pixels": {"start": 1},
        "fps=1 and nframes=2 both set; give one": {"fps": 1, "nframes": 2},
        "nframes=2.5: give a positive whole number": {"nframes": 2.5},
        "fps=-1: give a positive number": {"fps": -1},
        "max_pixels='big': give a positive whole number": {"max_pixels": "big"},
    }
    for message, options in cases.items():
        with pytest.raises(VideoError, match=message.replace("(", r"\(")):
            sampling(options)
    with pytest.raises(VideoError, match="no clock; sample it with nframes or max_frames"):
        sequence_indices(3, VideoSampling(fps=1.0))


@pytest.mark.parametrize("suffix", [".mp4", ".webm"])
def test_a_video_file_decodes_to_the_sampled_frames_with_their_times(tmp_path, suffix) -> None:
    path = write_video(tmp_path / f"clip{suffix}", frames=20, rate=10, size=(64, 48))
    frames = read_video(path, VideoSampling(fps=2.0))
    assert [(f.index, f.label) for f in frames] == [
        (0, "frame 0 at 0.0 s"),
        (6, "frame 6 at 0.6 s"),
        (13, "frame 13 at 1.3 s"),
        (19, "frame 19 at 1.9 s"),
    ]
    assert all(abs(frame_red(f.image) - red(f.index)) <= 8 for f in frames)  # the frames asked for
    small = read_video(path.read_bytes(), VideoSampling(nframes=2, max_pixels=600))
    assert [f.image.size for f in small] == [(28, 21), (28, 21)] and small[1].index == 19


def test_video_values_a_path_a_data_url_bytes_or_frame_images(tmp_path) -> None:
    data = write_video(tmp_path / "clip.mp4", frames=4, rate=4).read_bytes()
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    one = VideoSampling(nframes=2)
    assert [f.index for f in video_frames(url, one, _no_frames)] == [0, 3]
    assert [f.index for f in video_frames(data, one, _no_frames)] == [0, 3]
    pictures = [Image.new("RGB", (8, 8), (i, 0, 0)) for i in range(5)]
    frames = video_frames(pictures, VideoSampling(nframes=3, max_pixels=16), lambda v, i: v)
    assert [(f.index, f.time, f.label, f.image.size) for f in frames][1] == (2, None, "frame 2", (4, 4))


def _no_frames(value, index):
    raise AssertionError("a video file has no frame images to open")


def test_unreadable_videos_say_why(tmp_path) -> None:
    whole = write_video(tmp_path / "clip.mp4", frames=6, rate=3).read_bytes()
    (tmp_path / "cut.mp4").write_bytes(whole[: len(whole) // 3])
    (tmp_path / "text.mp4").write_text("hello")
    cases = {
        str(tmp_path / "gone.mp4"): "no such file; give an existing path",
        str(tmp_path / "text.mp4"): "not a readable video",
        "data:video/mp4,plain": "a data URL must be base64",
    }
    for value, message in cases.items():
        with pytest.raises(VideoError, match=message):
            video_frames(value, VideoSampling(), _no_frames)
    with pytest.raises(VideoError):  # a file cut short: its header promises frames the stream lacks
        read_video(tmp_path / "cut.mp4", VideoSampling())
    with pytest.raises(VideoError, match="got int"):
        video_frames(3, VideoSampling(), _no_frames)


def test_a_file_cut_short_is_sampled_within_the_frames_it_holds(tmp_path) -> None:
    whole = write_video(tmp_path / "clip.mp4", frames=20, rate=10, index_first=True).read_bytes()
    (tmp_path / "cut.mp4").write_bytes(whole[: int(len(whole) * 0.7)])  # the index still says 20 frames
    frames = read_video(tmp_path / "cut.mp4", VideoSampling(nframes=4))
    assert len(frames) == 4 and frames[0].index == 0 and frames[-1].index < 19
    assert all(abs(frame_red(f.image) - red(f.index)) <= 8 for f in frames)


def test_fit_pixels_keeps_the_aspect_and_never_grows() -> None:
    image = Image.new("RGB", (400, 100))
    assert fit_pixels(image, 10_000).size == (200, 50)
    assert fit_pixels(image, 10**6) is image and fit_pixels(image, None) is image
