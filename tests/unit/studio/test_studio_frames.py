"""Simulator frames in the episode browser: a rendering episode writes its frames under <run_dir>/frames and
its metadata lists them; the store keeps the list; the episode's view pairs each frame with the action taken
on it and that step's reward, and /api/frame serves the PNGs (and nothing outside that folder)."""

from __future__ import annotations

import io
from pathlib import Path

from fastapi.testclient import TestClient
from PIL import Image

from ascent.envs import Task, run_episodes
from ascent.envs.sim import SimVectorEnvs
from ascent.envs.tasks.control_task import control_rows
from ascent.messages import Generation, SamplingParams
from ascent.studio import create_app
from ascent.transport.store_writer import Entry, ExperienceWriter, prepare_store
from tests.unit.envs.sim.test_vector import FakeChat


def reach_episode(run_dir: Path):
    """One Reach episode that renders (offset +2 from seed 3: two steps right reach the target)."""
    row = control_rows("reach", [3])[0] | {"render": True, "frames_dir": str(run_dir / "frames")}

    def generate(requests):
        return [[Generation([ord(c) for c in "<a1>"], [0.0] * 4, "stop")] for _ in requests]

    params = SamplingParams(max_new_tokens=4)
    [episode] = run_episodes(
        [Task("gym", row, 0)], generate, FakeChat(), params, max_turns=3, max_tokens=200, envs=SimVectorEnvs()
    )
    return episode


def test_the_episode_view_shows_frames_beside_actions_and_rewards(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "sim"
    episode = reach_episode(run_dir)
    frames = episode.metadata["frames"]
    assert len(frames) == 3 and all((run_dir / "frames" / f).is_file() for f in frames)  # reset + 2 steps
    (run_dir / "metrics.jsonl").write_text("")
    path = run_dir / "experience.db"
    prepare_store(path, 0, meta={"tokenizer": ""})
    writer = ExperienceWriter(path, decode=lambda ids: "".join(chr(i) for i in ids))
    writer.put([Entry(episode, 1, "trained", 1, group_index=0, env="gym")])
    writer.close()
    assert writer.error is None

    client = TestClient(create_app(tmp_path / "runs"), base_url="http://127.0.0.1:8765")
    steps = client.get("/api/episode", params={"run": "sim", "id": 1}).json()["steps"]
    assert [(s["step"], s["action"], s["reward"]) for s in steps] == [
        (0, "<a1>", 0.0),
        (1, "<a1>", 1.0),
        (2, None, None),
    ]
    png = client.get("/api/frame", params={"run": "sim", "path": steps[1]["frame"]})
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(png.content)).size == (224, 32)
    (run_dir / "secret.png").write_bytes(png.content)
    for bad in ("../secret.png", "../experience.db", str(run_dir / "secret.png"), "nope.png"):
        assert client.get("/api/frame", params={"run": "sim", "path": bad}).status_code == 404


def test_an_episode_without_frames_has_no_steps(tmp_path: Path) -> None:
    from .conftest import make_run

    make_run(tmp_path / "runs" / "rl")
    client = TestClient(create_app(tmp_path / "runs"), base_url="http://127.0.0.1:8765")
    assert client.get("/api/episode", params={"run": "rl", "id": 1}).json()["steps"] == []
