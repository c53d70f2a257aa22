"""The trackers through the real `ascent train` on a tiny model: MLflow (a local file store) and W&B
offline receive the run's metrics, status.json ends `finished`, and tracking.log_level filters the log."""

from __future__ import annotations

import json
import subprocess
import sys

import mlflow
import pytest
from conftest import ascent, run_config, write_yaml

from ascent.tracking import read_metrics, read_status


def test_train_logs_to_mlflow_and_wandb_offline(tmp_path, tiny_model, arithmetic_data, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # offline needs no key
    monkeypatch.setenv("NETRC", str(tmp_path / "no.netrc"))
    store = tmp_path / "mlruns"
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=2, val_every=0)
    cfg["tracking"] |= {
        "mlflow_uri": str(store),
        "mlflow_experiment": "tiny",
        "wandb_project": "tiny",
        "wandb_mode": "offline",
        "log_level": "warning",
    }
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    run_dir = tmp_path / "run"

    status = read_status(run_dir)
    assert status["state"] == "finished" and status["kind"] == "train" and status["error"] is None
    assert status["step"] == 2 and status["total_steps"] == 2

    jsonl = {r["step"]: r for r in read_metrics(run_dir)}
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
    run = client.get_run((run_dir / "mlflow_run_id.txt").read_text().strip())
    assert run.info.status == "FINISHED" and run.data.params["rollout.samples_per_prompt"] == "4"
    assert client.get_experiment(run.info.experiment_id).name == "tiny"
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "reward/mean")}
    expected = {
        step: pytest.approx(r["reward/mean"], rel=1e-6) for step, r in jsonl.items() if "reward/mean" in r
    }
    assert sorted(expected) == [1, 2] and logged == expected

    [wandb_file] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    history = [json.loads(x)["history"]["item"] for x in out.splitlines() if '"type":"history"' in x]
    trained = [(h["_step"], h["loss/policy"]) for h in history if "loss/policy" in h]
    assert trained == [(s, pytest.approx(jsonl[s]["loss/policy"], rel=1e-6)) for s in (1, 2)]

    log = (run_dir / "logs" / "controller.log").read_text()
    assert " INFO " not in log  # tracking.log_level=warning (the default logs a line per iteration)
