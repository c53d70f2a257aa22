"""bench/two_gpus.py on CPU: its smallest mode (one_gpu: inline `run_training`, tiny shape) runs in a child,
its metrics.jsonl becomes the per-mode table and the JSON, `--compare` reads that JSON back; and the GPU
memory sampler parses what nvidia-smi prints (a stand-in script)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT

BENCH = ROOT / "bench" / "two_gpus.py"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(BENCH), *argv], capture_output=True, text=True, timeout=300, env=env
    )


def test_one_gpu_mode_on_cpu_reports_its_iterations(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc = _run(
        "--mode",
        "one_gpu",
        "--device",
        "cpu",
        "--shape",
        "tiny",
        "--root",
        str(tmp_path / "root"),
        "--warmup",
        "1",
        "--iterations",
        "2",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = proc.stdout
    assert "== one_gpu: inline" in table and "completions/s" in table
    for row in ("time/iteration", "time/generate", "time/update", "time/publish", "time/trainer_idle"):
        assert row in table, row
    res = json.loads(out.read_text())["results"][0]
    assert res["mode"] == "one_gpu" and res["rc"] == 0 and res["transport"] == "inline"
    summary = res["summary"]
    assert summary["iterations_logged"] == 3 and summary["iterations_timed"] == 2
    assert summary["steps_timed"] == [2, 3]
    assert summary["completions_per_s_wall"] > 0
    assert summary["keys"]["rollout/response_len_mean"]["median"] == 8  # the CPU preset's 8 new tokens
    assert (
        res["config"]["cluster"]["backend"] == "inline" and res["config"]["rollout"]["engine"] == "reference"
    )

    again = _run("--compare", str(out), "--root", str(tmp_path / "root"))
    assert again.returncode == 0, again.stdout + again.stderr
    lines = again.stdout.splitlines()
    assert any(line.startswith("one_gpu") and " 1.00 " in line for line in lines), again.stdout


def test_gpu_sampler_reads_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, 2048, 81920, 50'\necho '1, 4096, 81920, [N/A]'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    spec = importlib.util.spec_from_file_location("two_gpus_report", ROOT / "bench" / "two_gpus_report.py")
    assert spec is not None and spec.loader is not None
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    sampler = report.GpuSampler(interval_s=0.05)
    time.sleep(0.5)
    sampler.stop()
    window = sampler.window()
    assert window["0"]["peak_gib"] == 2.0 and window["0"]["total_gib"] == 80.0
    assert window["0"]["util_mean"] == 50.0 and window["0"]["samples"] >= 2
    assert window["1"]["peak_gib"] == 4.0 and window["1"]["util_mean"] is None  # "[N/A]": no figure
