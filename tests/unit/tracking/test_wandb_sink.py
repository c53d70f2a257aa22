"""The W&B sink with the real `wandb` in offline mode: the run is written under the run directory without a
key, the logged values read back from its files (`wandb leet inspect --json`, W&B's own reader of its
transaction log), a resumed run keeps the W&B run id, and start-up failures name the field and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ascent.errors import AscentError
from ascent.tracking import EventBus, Metrics, RunEnded, RunStarted
from ascent.tracking.wandb_sink import WANDB_ID_FILE, WandbSink

CONFIG = {"seed": 3, "train": {"lr": 0.001}}


@pytest.fixture(autouse=True)
def no_key(tmp_path, monkeypatch):
    """No W&B key anywhere: offline mode must not need one."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no W&B settings
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)


def offline_run(run_dir, steps, end="finished", resume_step=0):
    sink = WandbSink(run_dir, "proj", mode="offline", http_proxy="http://127.0.0.1:9", config=CONFIG)
    assert not os.environ.get("HTTPS_PROXY")  # the proxy went to W&B's settings, not to the process
    bus = EventBus([sink])
    bus.publish(RunStarted(str(run_dir), "train", CONFIG, total_steps=3, resume_step=resume_step))
    for step, values in steps:
        bus.publish(Metrics.of(step, values))
    bus.publish(RunEnded(end))
    bus.close()
    assert bus.sinks == ()


def records(run_file) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def history(run_file) -> list[dict]:
    rows = [r["history"]["item"] for r in records(run_file) if r.get("type") == "history"]
    return [{k: v for k, v in row.items() if not k.startswith("_") or k == "_step"} for row in rows]


def test_offline_run_under_the_run_dir_holds_the_logged_values(tmp_path):
    run_dir = tmp_path / "run"
    offline_run(run_dir, [(1, {"reward/mean": 0.25, "n": 3, "s": "text"}), (2, {"reward/mean": 0.5})])
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    [run_file] = run_dir.glob(f"wandb/offline-run-*/run-{run_id}.wandb")
    assert history(run_file) == [{"_step": 1, "reward/mean": 0.25, "n": 3}, {"_step": 2, "reward/mean": 0.5}]
    [run] = [r["run"] for r in records(run_file) if r.get("type") == "run"]
    assert run["run_id"] == run_id and run["project"] == "proj"
    config = run["config"]["update"]
    assert config["seed"] == 3 and config["train"] == {"lr": 0.001} and run["display_name"] == "run"


def test_a_resumed_run_keeps_the_wandb_run_id(tmp_path):
    run_dir = tmp_path / "run"
    offline_run(run_dir, [(1, {"x": 1.0})], end="interrupted")
    offline_run(run_dir, [(2, {"x": 2.0})], resume_step=1)
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))  # one per process, same W&B run
    assert len(files) == 2 and {f.name for f in files} == {f"run-{run_id}.wandb"}
    steps = [h["_step"] for f in files for h in history(f)]
    assert sorted(steps) == [1, 2]


def test_online_without_a_key_fails_at_start_up_with_the_fixes(tmp_path):
    with pytest.raises(AscentError) as info:
        WandbSink(tmp_path, "proj", mode="online", config=CONFIG)
    message = str(info.value)
    assert "tracking.wandb_project='proj'" in message and "wandb login" in message
    assert "tracking.wandb_mode=offline" in message


def test_not_installed_names_the_field_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.raises(AscentError, match=r"tracking\.wandb_project='proj'.*pip install wandb"):
        WandbSink(tmp_path, "proj")
