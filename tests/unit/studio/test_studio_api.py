"""The studio's HTTP API through FastAPI's test client: every view's data, the editor's validate and save
(the CLI's own error lines), and access: token, cookie, loopback Host, paths that leave RUNS_DIR."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from ascent.studio import create_app

RUN = "sweep/lr1/run"


@pytest.fixture
def client(runs_root: Path) -> TestClient:
    return TestClient(create_app(runs_root), base_url="http://127.0.0.1:8765")


def test_runs_metrics_since_and_timeline(client: TestClient) -> None:
    (run,) = client.get("/api/runs").json()["runs"]
    assert run["id"] == RUN and run["state"] == "finished"
    full = client.get("/api/metrics", params={"run": RUN}).json()
    assert full["series"]["reward/mean"]["step"] == [1, 2, 3]
    assert full["groups"]["grad_norm"] == "train"
    newer = client.get("/api/metrics", params={"run": RUN, "since": 2}).json()
    assert newer["series"]["reward/mean"]["step"] == [3]
    assert newer["series"]["reward/mean"]["value"] == [pytest.approx(0.3)]
    assert len(newer["series"]["reward/mean"]["time"]) == 1 and newer["t0"] is not None
    timeline = client.get("/api/timeline", params={"run": RUN}).json()
    assert timeline["iterations"] == [1, 2, 3] and timeline["iteration"] == 3
    assert [(p["name"], p["depth"]) for p in timeline["phases"]] == [
        ("rollout", 0),
        ("generate", 1),
        ("update", 0),
    ]
    first = client.get("/api/timeline", params={"run": RUN, "iteration": 1}).json()
    assert first["iteration"] == 1 and first["phases"][0]["start_s"] == 0


def test_episode_filters_and_one_episode_token_by_token(client: TestClient) -> None:
    listing = client.get("/api/episodes", params={"run": RUN}).json()
    assert (listing["total"], listing["envs"], listing["iterations"]) == (3, ["calc", "search"], [1, 2])
    dropped = client.get("/api/episodes", params={"run": RUN, "status": "dropped"}).json()
    assert [e["status"] for e in dropped["episodes"]] == ["dropped_stale"]
    rich = client.get("/api/episodes", params={"run": RUN, "min_reward": 0.4, "env": "search"}).json()
    assert [e["row_id"] for e in rich["episodes"]] == [2]
    it2 = client.get("/api/episodes", params={"run": RUN, "iteration": 2, "max_reward": 0.1}).json()
    assert [e["row_id"] for e in it2["episodes"]] == [1]
    ep = client.get("/api/episode", params={"run": RUN, "id": 1}).json()
    labels = [s["label"] for s in ep["segments"]]
    assert labels == ["prompt", "model turn 1, reward 0", "observation", "model turn 2, reward 1"]
    turn1, observation = ep["segments"][1], ep["segments"][2]
    assert [(t["text"], t["mask"], t["logprob"]) for t in turn1["tokens"]] == [
        ("call", 1, -0.1),
        ("calc", 1, -2.5),
    ]
    assert [(t["text"], t["mask"]) for t in observation["tokens"]] == [("result", 0), ("4", 0)]
    assert ep["segments"][3]["tokens"][0]["version"] == 2
    missing = client.get("/api/episode", params={"run": RUN, "id": 99})
    assert missing.status_code == 400 and "no episode with id 99" in missing.json()["error"]


def test_config_is_explained_and_the_editor_speaks_like_the_cli(client: TestClient) -> None:
    cfg = client.get("/api/config", params={"run": RUN}).json()
    assert cfg["kind"] == "train" and cfg["problems"] == []
    lr = next(r for r in cfg["sections"]["train"] if r["name"] == "lr")
    assert lr["changed"] and lr["value"] == "2e-05" and "learning rate" in lr["description"]
    bad = client.post("/api/validate", json={"text": "train:\n  lr: -1\n", "kind": "train"}).json()
    assert not bad["ok"] and bad["fields"] == ["train.lr"]
    assert bad["problems"] == ["train.lr=-1: must be > 0 (Peak learning rate of AdamW)."]
    typo = client.post("/api/validate", json={"text": "rollout:\n  samples_per_promt: 4\n"}).json()
    assert "did you mean 'rollout.samples_per_prompt'?" in typo["problems"][0]
    broken = client.post("/api/validate", json={"text": "train: [\n"}).json()
    assert "config file 'editor' is not valid YAML" in broken["problems"][0]
    assert client.post("/api/validate", json={"text": "epochs: 2\n", "kind": "sft"}).json()["ok"]
    hints = client.get("/api/schema", params={"kind": "train"}).json()["fields"]
    assert "train" in hints and "learning rate" in hints["train.lr"]


def test_save_writes_valid_yaml_under_runs_dir_only(client: TestClient, runs_root: Path) -> None:
    text = "iterations: 4\ntrain:\n  lr: 1.0e-05\n"
    saved = client.post("/api/save", json={"text": text, "path": "configs/new.yaml"}).json()
    assert saved["relative"] == "configs/new.yaml"
    assert yaml.safe_load((runs_root / "configs/new.yaml").read_text()) == {
        "iterations": 4,
        "train": {"lr": 1e-5},
    }
    again = client.post("/api/save", json={"text": text, "path": "configs/new.yaml"})
    assert again.status_code == 400 and "already exists" in again.json()["error"]
    assert client.post(
        "/api/save", json={"text": text, "path": "configs/new.yaml", "overwrite": True}
    ).is_success
    for path, why in (("../escape.yaml", "outside the runs directory"), ("x.txt", "name a .yaml file")):
        response = client.post("/api/save", json={"text": text, "path": path})
        assert response.status_code == 400 and why in response.json()["error"]
    invalid = client.post("/api/save", json={"text": "train:\n  lr: 0\n", "path": "bad.yaml"})
    assert invalid.status_code == 400 and invalid.json()["problems"][0].startswith("train.lr=0")
    assert not (runs_root / "bad.yaml").exists() and not (runs_root.parent / "escape.yaml").exists()


def test_a_save_path_that_cannot_be_written_is_a_400_naming_it(client: TestClient, runs_root: Path) -> None:
    text = "iterations: 4\n"
    (runs_root / "taken.yaml").mkdir()
    (runs_root / "notes").write_text("a file, not a folder")
    for path in ("taken.yaml", "notes/run.yaml"):
        response = client.post("/api/save", json={"text": text, "path": path, "overwrite": True})
        assert response.status_code == 400, response.text
        assert f"save path {path!r}: cannot write there" in response.json()["error"]
    assert sorted(p.name for p in runs_root.iterdir()) == ["notes", "sweep", "taken.yaml"]  # no .tmp left


def test_unknown_or_escaping_runs_are_404(client: TestClient) -> None:
    for run in ("../..", "nope"):
        response = client.get("/api/metrics", params={"run": run})
        assert response.status_code == 404 and "run" in response.json()["error"]


def test_without_a_token_only_loopback_host_names_are_served(runs_root: Path) -> None:
    app = create_app(runs_root)
    assert TestClient(app, base_url="http://localhost:8765").get("/api/runs").status_code == 200
    assert TestClient(app, base_url="http://[::1]:8765").get("/api/runs").status_code == 200
    rebound = TestClient(app, base_url="http://attacker.example:8765").get("/api/runs")
    assert rebound.status_code == 403


def test_with_a_token_every_request_must_carry_it(runs_root: Path) -> None:
    client = TestClient(create_app(runs_root, token="s3cret"), base_url="http://10.1.2.3:8765")
    for path in ("/", "/api/runs", "/static/app.js", "/vendor/plotly.min.js"):
        assert client.get(path).status_code == 401, path
    assert client.get("/api/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    entry = client.get("/?token=s3cret", follow_redirects=False)
    assert entry.status_code == 303 and entry.headers["location"] == "/"
    assert "httponly" in entry.headers["set-cookie"].lower()
    assert client.get("/api/runs").status_code == 200  # the cookie the redirect set
    page = client.get("/")
    assert page.status_code == 200 and "/vendor/plotly.min.js" in page.text
    assert client.get("/vendor/plotly.min.js").status_code == 200


def test_a_malformed_request_is_a_422_naming_the_field_and_the_value(client: TestClient) -> None:
    """FastAPI's request validation errors come back as the studio's other errors do: one sentence each."""
    wrong = client.post("/api/save", json={"text": "iterations: 4\n", "path": "a.yaml", "overwrite": "maybe"})
    assert wrong.status_code == 422
    assert wrong.json()["problems"] == [
        "overwrite='maybe': Input should be a valid boolean, unable to interpret input"
    ]
    missing = client.post("/api/validate", json={"kind": "train"})
    assert (
        missing.status_code == 422 and missing.json()["error"] == "text is missing: the request must send it"
    )
    no_run = client.get("/api/config")
    assert no_run.status_code == 422 and no_run.json()["problems"] == [
        "run is missing: the request must send it"
    ]
