"""The image environments (`zoom_qa`, `image_qa`) played by a scripted policy, without a model: what the first
message shows, what each tool returns (images as content parts, errors as text), the final answer's score,
and the generated zoom task (its details visible in a zoom, averaged away at half size)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from PIL import Image

from ascent.data.loading import load_rows
from ascent.envs import make_env
from ascent.envs.image_env import ZoomQa
from ascent.envs.tasks.zoom_task import PATTERNS, QUARTERS, demonstration, main, make_zoom_task, pattern
from ascent.envs.tools.image_tools import load_image, zoom
from tests.unit.video_files import frame_red, red, write_video


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def images_of(message: Any) -> list[Image.Image]:
    return [p["image"] for p in message["content"] if p["type"] == "image"]


def texts_of(message: Any) -> str:
    return " ".join(p["text"] for p in message["content"] if p["type"] == "text")


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    path = make_zoom_task(tmp_path_factory.mktemp("zoom"), 8, seed=1, n_val=4)
    return [json.loads(line) for line in path.read_text().splitlines()]


def nearest_pattern(square: np.ndarray) -> str:
    """The pattern whose pixels are closest (mean absolute difference) to `square`'s, its border aside."""
    inner = square[1:-1, 1:-1]
    return min(PATTERNS, key=lambda p: np.abs(inner - pattern(p, len(square))[1:-1, 1:-1]).mean())


QUARTER_BOX = {"top-left": [0, 0, 0.5, 0.5], "top-right": [0.5, 0, 1, 0.5]}
QUARTER_BOX |= {"bottom-left": [0, 0.5, 0.5, 1], "bottom-right": [0.5, 0.5, 1, 1]}


def test_zooming_into_the_named_quarter_shows_the_pattern_that_answers(rows) -> None:
    row = rows[0]
    env = make_env("zoom_qa")
    system, user = env.reset(row)
    assert system["role"] == "system" and "zoom_in" in system["content"]
    assert texts_of(user).endswith(row["prompt"]) and images_of(user)[0].size == (448, 448)
    assert [t["function"]["name"] for t in env.tools] == ["zoom_in"]
    step = env.step("let me look " + call("zoom_in", bbox=QUARTER_BOX[row["quarter"]]))
    assert not step.done and step.reward == 0.0 and step.info == {"tool_calls": 1}
    (result,) = step.observation
    assert result["role"] == "tool" and "Zoomed into [" in texts_of(result) and "Image 1" in texts_of(result)
    (zoomed,) = images_of(result)
    assert zoomed.size == (448, 448)  # the quarter, twice as large
    x1, y1, x2, y2 = row["box"]
    ox, oy = (224 if x1 >= 224 else 0), (224 if y1 >= 224 else 0)
    at_budget = np.asarray(
        zoomed.resize((224, 224), Image.Resampling.BICUBIC), dtype=float
    )  # the processor's
    assert nearest_pattern(at_budget[y1 - oy : y2 - oy, x1 - ox : x2 - ox, 0]) == row["answer"]
    final = env.step(f"<answer>{row['answer']}</answer>")
    assert final.done and final.reward == 1.0 and final.info == {"tool_calls": 0}


def test_a_wrong_answer_scores_zero_and_image_qa_has_no_tools(rows) -> None:
    row = rows[1]
    wrong = next(p for p in PATTERNS if p != row["answer"])
    env = make_env("zoom_qa")
    env.reset(row)
    assert env.step(f"<answer>{wrong}</answer>").reward == 0.0
    plain = make_env("image_qa")
    messages = plain.reset(row)
    assert plain.tools is None and "zoom_in" not in messages[0]["content"]
    step = plain.step(call("zoom_in", bbox=[0, 0, 1, 1]))  # no tools: every turn is the answer
    assert step.done and step.reward == 0.0 and step.observation == ()


def test_tool_mistakes_are_answered_as_text_and_the_episode_goes_on(rows) -> None:
    env = ZoomQa()
    env.reset(rows[2])
    action = (
        call("zoom_in", bbox=[0.5, 0.5, 0.1, 0.9])
        + call("zoom_in", bbox=[0, 0, 1, 1], image=3)
        + call("zoom_in", bbox="top left")
        + call("rotate", angle=90)
        + "<tool_call>{not json</tool_call>"
    )
    step = env.step(action)
    assert not step.done and step.info == {"tool_calls": 5}
    texts = [texts_of(m) if isinstance(m["content"], list) else m["content"] for m in step.observation]
    assert "x1 < x2 and y1 < y2" in texts[0]
    assert "no image 3; the images shown are 0 to 0" in texts[1]
    assert "bad arguments for zoom_in: bbox" in texts[2]
    assert "no tool 'rotate'; the tools are zoom_in" in texts[3]
    assert "could not read the tool call" in texts[4]
    assert not any(images_of(m) for m in step.observation if isinstance(m["content"], list))


def test_zooming_into_a_zoom_numbers_the_images_on(rows) -> None:
    env = ZoomQa()
    env.reset(rows[0])
    env.step(call("zoom_in", bbox=[0, 0, 224, 224]))
    (result,) = env.step(call("zoom_in", bbox=[0, 0, 0.5, 0.5], image=1)).observation
    assert "of image 1" in texts_of(result) and "Image 2" in texts_of(result)
    expected = env.seen[0].crop((0, 0, 112, 112)).resize((448, 448), Image.Resampling.BICUBIC)
    got = np.asarray(images_of(result)[0], dtype=float)
    assert (
        np.abs(got - np.asarray(expected, dtype=float)).mean() < 2
    )  # the eighth of image 0, 4x (resampled twice)


def frames_row() -> dict[str, Any]:
    frames = [np.full((32, 48, 3), 20 * i, dtype=np.uint8).tolist() for i in range(9)]
    return {"prompt": "In which frame is the image brightest?", "answer": 8, "frames": frames}


def test_a_sequence_shows_a_preview_and_select_frames_shows_the_rest() -> None:
    env = ZoomQa()
    _, user = env.reset(frames_row())
    assert [t["function"]["name"] for t in env.tools] == ["zoom_in", "select_frames"]
    assert "Image 3 (frame 8)" in texts_of(user) and len(images_of(user)) == 4  # frames 0, 3, 5, 8
    (result,) = env.step(call("select_frames", frames=[7, 1])).observation
    shown = images_of(result)
    assert [int(np.asarray(im)[0, 0, 0]) for im in shown] == [140, 20]
    assert "Image 4 (frame 7)" in texts_of(result) and "Image 5 (frame 1)" in texts_of(result)
    (error,) = env.step(call("select_frames", frames=[0, 1, 2, 3, 4])).observation
    assert "at most 4 per call" in texts_of(error) and not images_of(error)
    assert env.step("<answer>8</answer>").reward == 1.0


def test_a_video_row_gives_its_sampled_frames_to_select_frames(tmp_path) -> None:
    write_video(tmp_path / "clip.mp4", frames=20, rate=10)  # 2 s: 4 frames at the default 2 per second
    rows = [
        {"prompt": "Which frame is reddest?", "answer": 3, "video": "clip.mp4"},
        {"prompt": "q", "answer": 1, "video": {"video": "clip.mp4", "nframes": 2}, "preview": [0]},
    ]
    (tmp_path / "d.jsonl").write_text(  # loading resolves the video path against the file's folder
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    default, two = load_rows(tmp_path / "d.jsonl")
    env = ZoomQa()
    _, user = env.reset(default)
    assert "Image 3 (frame 3 at 1.9 s)" in texts_of(user) and len(images_of(user)) == 4
    (result,) = env.step(call("select_frames", frames=[2])).observation
    assert "Image 4 (frame 2 at 1.3 s)" in texts_of(result)
    assert abs(frame_red(images_of(result)[0]) - red(13)) <= 8  # the clip's frame 13
    _, user = env.reset(two)
    assert "Image 0 (frame 0 at 0.0 s)" in texts_of(user) and len(env.frames) == 2
    with pytest.raises(ValueError, match=f"video={tmp_path / 'gone.mp4'}: no such file"):
        env.reset({**default, "video": str(tmp_path / "gone.mp4")})
    with pytest.raises(ValueError, match="both 'frames' and 'video'; give one"):
        env.reset({**frames_row(), "video": "clip.mp4"})


def test_a_row_without_its_image_is_refused_naming_the_field() -> None:
    with pytest.raises(KeyError, match="the row has no 'image'"):
        ZoomQa().reset({"prompt": "what?", "answer": "x"})
    with pytest.raises(ValueError, match="no frame 12"):
        ZoomQa().reset({**frames_row(), "preview": [0, 12]})


def test_generated_details_vanish_at_half_size(rows) -> None:
    """At the tiny model's pixel budget (half size, the processor's bicubic resize), the four patterns look
    alike: the means of their squares differ by less than the shades that tell the frame from the fill."""
    for row in rows[:4]:
        half = np.asarray(load_image(row["image"]).resize((224, 224), Image.Resampling.BICUBIC), dtype=float)
        x1, y1, x2, y2 = (v // 2 for v in row["box"])
        inner = half[y1 + 1 : y2 - 1, x1 + 1 : x2 - 1, 0]
        assert abs(inner.mean() - 128) < 8 and inner.std() < 8  # a flat grey, whatever the pattern


def test_the_generator_is_seeded_splits_by_image_and_writes_both_envs_and_shapes(tmp_path) -> None:
    def load(path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines()]

    first = make_zoom_task(tmp_path / "a", 6, seed=4, n_val=3, size=256, detail=8)
    assert load(first) == load(make_zoom_task(tmp_path / "b", 6, seed=4, n_val=3, size=256, detail=8))
    train, val = load(first), load(first.with_name("val.jsonl"))
    assert len(train) == 6 and len(val) == 3 and not {r["image"] for r in train} & {r["image"] for r in val}
    assert load_image(train[0]["image"]).size == (256, 256) and {r["env"] for r in train} == {"zoom_qa"}
    main([str(tmp_path / "c"), "--rows", "4", "--val", "1", "--env", "image_qa", "--shape", "skyrl"])
    (row,) = load(tmp_path / "c" / "val.jsonl")
    assert row["env_class"] == "image_qa" and row["reward_spec"]["ground_truth"] in PATTERNS
    env = make_env(row["env_class"])
    _, user = env.reset(row)  # SkyRL's shape: the image read from extra_info
    assert images_of(user)[0].size == (448, 448)
    assert env.step(f"<answer>{row['reward_spec']['ground_truth']}</answer>").reward == 1.0
    with pytest.raises(ValueError, match="a framed square fits in a quarter"):
        make_zoom_task(tmp_path / "d", 4, size=100, detail=44)


def test_at_the_examples_scale_the_texture_is_gone_whole_and_strong_zoomed(tmp_path) -> None:
    """examples/vision's scale: 112 px images, 40 px squares, a budget of 4 image tokens (56 x 56 pixels).
    In the whole image at the budget every square is a flat grey (std under 2 grey levels); in the zoom of
    its quarter at the budget its 1-pixel stripes swing by about 60 grey levels (checkers ~30, solid ~1)."""
    path = make_zoom_task(tmp_path, 8, seed=3, n_val=1, size=112, detail=40)
    swing = {"horizontal": 40, "vertical": 40, "checkered": 15}
    for row in [json.loads(line) for line in path.read_text().splitlines()]:
        image = load_image(row["image"])
        x1, y1, x2, y2 = row["box"]
        whole = np.asarray(image.resize((56, 56), Image.Resampling.BICUBIC), dtype=float)
        assert whole[y1 // 2 + 1 : y2 // 2 - 1, x1 // 2 + 1 : x2 // 2 - 1].std() < 2
        col, line = QUARTERS[row["quarter"]]
        zoomed = zoom(image, (56 * col, 56 * line, 56 * col + 56, 56 * line + 56), 112)
        at_budget = np.asarray(zoomed.resize((56, 56), Image.Resampling.BICUBIC), dtype=float)
        inner = at_budget[y1 - 56 * line + 1 : y2 - 56 * line - 1, x1 - 56 * col + 1 : x2 - 56 * col - 1]
        assert inner.std() > swing.get(row["answer"], -1) and (row["answer"] != "solid" or inner.std() < 3)


def test_an_image_qa_demonstration_answers_at_once(rows) -> None:
    row = {**rows[0], "env": "image_qa"}
    demo = demonstration(row)
    assert demo["tools"] is None and [m["role"] for m in demo["messages"]] == ["system", "user", "assistant"]
    assert demo["messages"][-1]["content"] == f"<answer>{row['answer']}</answer>"


def test_questions_can_ask_about_one_quarter_only(tmp_path) -> None:
    path = make_zoom_task(tmp_path, 6, seed=2, n_val=2, size=112, detail=40, quarters=("top-left",))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert (
        len(rows) == 6
        and {r["quarter"] for r in rows} == {"top-left"}
        and len({r["image"] for r in rows}) == 6
    )
    with pytest.raises(ValueError, match="quarters=\\['middle'\\]: choose among top-left"):
        make_zoom_task(tmp_path, 4, quarters=("middle",))
