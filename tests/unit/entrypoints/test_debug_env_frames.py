"""`ascent debug env --random-actions --frames`: a rendered simulator's episodes as a PNG strip and a GIF."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from ascent.entrypoints.debug_env import run_debug_env
from ascent.errors import AscentError
from ascent.models.tiny import DEFAULT_CHARS, make_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    make_char_tokenizer(out, DEFAULT_CHARS, [f"<a{k}>" for k in range(8)])
    return out


def rows(tmp_path, **extra):
    path = tmp_path / "rows.jsonl"
    row = {"gym_id": "InvertedPendulum-v5", "seed": 0, "max_steps": 3, "bins": 8, "env": "gym", **extra}
    path.write_text(json.dumps(row) + "\n")
    return path


def test_random_actions_render_a_strip_and_a_gif(tmp_path, tokenizer_dir):
    out = tmp_path / "frames"
    (ep,) = run_debug_env(
        str(tokenizer_dir),
        str(rows(tmp_path, render=True)),
        None,
        1,
        max_turns=3,
        random_actions=True,
        frames=str(out),
    )
    steps = ep.metadata["episode_length"]
    assert ep.metadata["turns"] == steps >= 1 and steps - 1 <= ep.reward <= steps  # 0 on a fall
    strip, gif = Image.open(out / "row0.png"), Image.open(out / "row0.gif")
    assert strip.size[0] == (steps + 1) * strip.size[1]  # the first frame and one per step, side by side
    assert gif.n_frames == steps + 1


def test_no_frames_without_render(tmp_path, tokenizer_dir, capsys):
    run_debug_env(
        str(tokenizer_dir),
        str(rows(tmp_path)),
        None,
        1,
        max_turns=2,
        random_actions=True,
        frames=str(tmp_path / "f"),
    )
    assert "no frames" in capsys.readouterr().out and not list((tmp_path / "f").iterdir())


def test_random_actions_need_a_simulator(tmp_path, tokenizer_dir):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"target": 3}) + "\n")
    with pytest.raises(AscentError, match="simulators only"):
        run_debug_env(str(tokenizer_dir), str(path), "guess_number", 1, random_actions=True)
