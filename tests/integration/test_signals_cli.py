"""Preemption and concurrent use, through the real CLI: SIGTERM stops at the end of an iteration with a
checkpoint, a message, exit 143 and status.json `interrupted`, and the resumed run ends `finished` with the
uninterrupted run's weights; a second run into a locked run_dir is refused with the owner's pid; Ctrl-C
while loading promises no checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ascent_here, run_config, write_yaml
from safetensors.torch import load_file

from ascent.tracking import read_status

HERE = Path(__file__).resolve().parent
# exact match; sleeps only where SLOW_REWARD_S is set; one reward worker, so an iteration's 8 calls take
# 8 x the sleep on any machine
SLOW = {"reward": {"fn": "slow_reward:score", "num_workers": 1}}


def start(cfg_yaml, *extra, slow_s=0.0):
    pythonpath = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "ascent", "train", str(cfg_yaml), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath, "SLOW_REWARD_S": str(slow_s)},
    )


def finish(cfg_yaml, *extra):
    proc = start(cfg_yaml, *extra)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out


def wait_for(predicate, proc, seconds=240):
    deadline = time.time() + seconds
    while not predicate():
        assert proc.poll() is None, "the run ended early:\n" + proc.communicate()[0]
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_sigterm_checkpoints_and_resume_matches_uninterrupted(tmp_path, tiny_model, arithmetic_data):
    base = {
        "iterations": 20,
        "val_every": 0,
        "data.val_path": None,
        "checkpoint": {"every": 0, "keep_last": 2},
        **SLOW,
    }
    a = run_config(tmp_path / "a", tiny_model, arithmetic_data, **base)
    # the uninterrupted run goes beside b, which spends its iterations asleep in the reward
    uninterrupted = start(write_yaml(tmp_path / "a.yaml", a))

    b = run_config(tmp_path / "b", tiny_model, arithmetic_data, **base)
    b_yaml = write_yaml(tmp_path / "b.yaml", b)
    proc = start(b_yaml, slow_s=0.2)  # 1.6 s an iteration: still running when the second run starts
    metrics = tmp_path / "b" / "run" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, proc)

    # the directory is locked while the first run writes (this process asks: no new interpreter needed)
    second = ascent_here("train", str(b_yaml), check=False)
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"pid {proc.pid}" in second.stderr and "in use" in second.stderr

    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=240)[0]
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "stopped by SIGTERM after iteration" in out and "Traceback" not in out
    ckpts = sorted((tmp_path / "b" / "run" / "checkpoints").glob("iter_*"))
    assert len(ckpts) == 1 and ckpts[0].name != "iter_000020", ckpts  # only the interrupt's checkpoint
    assert ckpts[0].name in out
    status = read_status(tmp_path / "b" / "run")
    assert status["state"] == "interrupted" and status["pid"] == proc.pid, status
    assert status["step"] == int(ckpts[0].name.removeprefix("iter_")) and status["total_steps"] == 20

    finish(b_yaml, "--resume")
    out = uninterrupted.communicate(timeout=300)[0]
    assert uninterrupted.returncode == 0, out
    status = read_status(tmp_path / "b" / "run")
    assert status["state"] == "finished" and status["step"] == 20 and status["pid"] != proc.pid
    wa = load_file(str(tmp_path / "a" / "run" / "checkpoints" / "iter_000020" / "model.safetensors"))
    wb = load_file(str(tmp_path / "b" / "run" / "checkpoints" / "iter_000020" / "model.safetensors"))
    for k in wa:
        assert (wa[k] == wb[k]).all(), k


def test_ctrl_c_while_loading_promises_no_checkpoint(tmp_path, tiny_model, arithmetic_data):
    cfg = run_config(tmp_path, tiny_model, arithmetic_data)
    proc = start(write_yaml(tmp_path / "r.yaml", cfg))
    log = tmp_path / "run" / "logs" / "controller.log"
    wait_for(log.exists, proc)  # the handlers are installed; the model is still loading
    os.kill(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    assert "No checkpoint of this run exists yet" in out and "Traceback" not in out
