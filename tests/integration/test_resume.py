"""A run killed with SIGKILL and resumed reaches the same final weights as an uninterrupted run.

The killed runs are processes of their own; the uninterrupted runs and the resumes run the CLI app in this
process (`ascent_here`: the same command without an interpreter start)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch
from conftest import ascent_here, run_config, write_yaml
from safetensors.torch import load_file


def final_weights(run_dir):
    ckpt = sorted((run_dir / "checkpoints").glob("iter_*"))[-1]
    return ckpt.name, load_file(str(ckpt / "model.safetensors"))


def test_sigkill_then_resume_matches_uninterrupted(tmp_path, tiny_model, arithmetic_data):
    base = {
        "iterations": 5,
        "val_every": 0,
        "checkpoint": {"every": 1, "keep_last": 2},
        "data.val_path": None,
    }
    a = run_config(tmp_path / "a", tiny_model, arithmetic_data, **base)
    ascent_here("train", str(write_yaml(tmp_path / "a.yaml", a)))

    b = run_config(tmp_path / "b", tiny_model, arithmetic_data, **base)
    b_yaml = write_yaml(tmp_path / "b.yaml", b)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ascent", "train", str(b_yaml)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpts = tmp_path / "b" / "run" / "checkpoints"
    deadline = time.time() + 240
    while not (ckpts / "iter_000002" / "state.json").exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (ckpts / "iter_000005").exists(), "killed too late to test resume"

    ascent_here("train", str(b_yaml), "--resume")
    name_a, wa = final_weights(tmp_path / "a" / "run")
    name_b, wb = final_weights(tmp_path / "b" / "run")
    assert name_a == name_b == "iter_000005"
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k] == wb[k]).all(), k


def _kill_after(cmd_yaml, command: str, ckpt_dir, name: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ascent", command, str(cmd_yaml)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 240
    while not (ckpt_dir / name / "state.json").exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_sft_sigkill_then_resume_matches_uninterrupted(tmp_path, tiny_model, arithmetic_data):
    def cfg(name):
        return {
            "run_dir": str(tmp_path / name),
            "epochs": 8.0,
            "batch_size": 4,
            "model": {"path": str(tiny_model)},
            "data": {"train_path": str(arithmetic_data / "sft.jsonl"), "max_prompt_tokens": 32},
            "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 128},
            "checkpoint": {"every": 5, "keep_last": 2},
            "tracking": {"progress": False, "tensorboard": False},
        }

    ascent_here("sft", str(write_yaml(tmp_path / "a.yaml", cfg("a"))))
    b_yaml = write_yaml(tmp_path / "b.yaml", cfg("b"))
    _kill_after(b_yaml, "sft", tmp_path / "b" / "checkpoints", "iter_000010")
    assert not (tmp_path / "b" / "final").exists(), "killed too late to test resume"
    ascent_here("sft", str(b_yaml), "--resume")
    wa = load_file(str(tmp_path / "a" / "final" / "model.safetensors"))
    wb = load_file(str(tmp_path / "b" / "final" / "model.safetensors"))
    for k in wa:
        assert (wa[k] == wb[k]).all(), k


def test_resume_without_optimizer_state_says_so(tmp_path, tiny_model, arithmetic_data):
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=1, val_every=0)
    cfg["data"]["val_path"] = None
    cfg["checkpoint"] = {"save_optimizer": False}
    cfg["tracking"] = {"progress": False, "trace": False}
    # the tiny model's rewards are all 0: without this no step is taken, AdamW stays fresh and a resume from
    # it is exact (nothing to warn about)
    cfg["train"]["step_on_zero_advantage"] = True
    ascent_here("train", str(write_yaml(tmp_path / "r.yaml", cfg)))
    run = tmp_path / "run"
    assert not (run / "trace.json").exists()
    state = torch.load(run / "checkpoints" / "iter_000001" / "trainer_state.pt", weights_only=True)
    assert state["optimizer"] is None and state["optimizer_saved"] is False
    cfg["iterations"] = 2
    proc = ascent_here("train", str(write_yaml(tmp_path / "r.yaml", cfg)), "--resume")
    assert "no optimizer state" in proc.stdout + proc.stderr
    assert (run / "checkpoints" / "iter_000002").is_dir()
