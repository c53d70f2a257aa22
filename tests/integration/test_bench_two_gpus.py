"""bench/two_gpus.py on CPU: its smallest mode (one_gpu: inline `run_training`, tiny shape) runs in a child,
its metrics.jsonl becomes the per-mode table and the JSON, `--compare` reads that JSON back; and the GPU
memory sampler parses what nvidia-smi prints (a stand-in script). The bench's parent side (`main(argv)`)
runs in this process: its children are processes of their own all the same, and a new interpreter for the
parent and another for `--compare` would each spend seconds importing torch."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from conftest import ROOT

BENCH = ROOT / "bench" / "two_gpus.py"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(monkeypatch, capsys, *argv: str) -> str:
    """`two_gpus.py ARGV` as its `__main__` runs it (the bench's folder on sys.path while it runs); its
    stdout."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the bench puts its folder first; undone after
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    capsys.readouterr()
    _load("two_gpus", BENCH).main(list(argv))
    return capsys.readouterr().out


def test_one_gpu_mode_on_cpu_reports_its_iterations(tmp_path: Path, monkeypatch, capsys) -> None:
    out = tmp_path / "out.json"
    table = _run(
        monkeypatch,
        capsys,
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

    again = _run(monkeypatch, capsys, "--compare", str(out), "--root", str(tmp_path / "root"))
    lines = again.splitlines()
    assert any(line.startswith("one_gpu") and " 1.00 " in line for line in lines), again


def test_gpu_sampler_reads_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, 2048, 81920, 50'\necho '1, 4096, 81920, [N/A]'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    report = _load("two_gpus_report", ROOT / "bench" / "two_gpus_report.py")
    sampler = report.GpuSampler(interval_s=0.05)
    time.sleep(0.5)
    sampler.stop()
    window = sampler.window()
    assert window["0"]["peak_gib"] == 2.0 and window["0"]["total_gib"] == 80.0
    assert window["0"]["util_mean"] == 50.0 and window["0"]["samples"] >= 2
    assert window["1"]["peak_gib"] == 4.0 and window["1"]["util_mean"] is None  # "[N/A]": no figure
