"""Checkpoints: atomic commit (temp dirs ignored), pruning, and a round trip of weights, optimizer and RNG."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from ascent.trainer.checkpoint import (
    commit_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    staging_dir,
)
from ascent.trainer.optim import build_optimizer, build_scheduler


def test_latest_ignores_staging_dirs_and_pruning_keeps_last(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    for it in (1, 2, 3):
        save_checkpoint(tmp_path, it, extra={"data_position": it * 10}, keep_last=2)
    crashed = staging_dir(tmp_path, 4)  # a crash mid-write leaves this behind
    (crashed / "state.json").write_text("{}")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["iter_000002", "iter_000003"]
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "iter_000003"
    assert load_checkpoint(latest)["state"] == {"iteration": 3, "data_position": 30}
    save_checkpoint(tmp_path, 5, keep_last=2)  # pruning also clears the stale staging dir
    assert not crashed.exists()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["iter_000003", "iter_000005"]


def test_failed_write_leaves_no_checkpoint(tmp_path):
    def boom(directory):
        (directory / "partial.bin").write_bytes(b"x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, 1, write_model=boom)
    assert latest_checkpoint(tmp_path) is None
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_round_trip_weights_optimizer_scheduler(tmp_path, tiny_model):
    opt = build_optimizer(tiny_model, lr=1e-2)
    sched = build_scheduler(opt, total_steps=10, warmup_steps=3)
    tiny_model(input_ids=torch.tensor([[5, 6, 7]]), labels=torch.tensor([[5, 6, 7]])).loss.backward()
    opt.step()
    sched.step()
    path = save_checkpoint(
        tmp_path,
        7,
        model=tiny_model,
        optimizer_state=opt.state_dict(),
        scheduler_state=sched.state_dict(),
        extra={"config": {"train": {"lr": 0.01}}},
        keep_last=1,
    )
    loaded = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    for (name, a), (_, b) in zip(tiny_model.state_dict().items(), loaded.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    ckpt = load_checkpoint(path)
    opt2 = build_optimizer(loaded, lr=1e-2)
    opt2.load_state_dict(ckpt["trainer_state"]["optimizer"])
    sched2 = build_scheduler(opt2, total_steps=10, warmup_steps=3)
    sched2.load_state_dict(ckpt["trainer_state"]["scheduler"])
    assert sched2.get_last_lr() == sched.get_last_lr()
    for s1, s2 in zip(opt.state.values(), opt2.state.values(), strict=True):
        torch.testing.assert_close(s1["exp_avg_sq"], s2["exp_avg_sq"], atol=0, rtol=0)
    assert ckpt["state"]["config"] == {"train": {"lr": 0.01}}


def test_rng_state_round_trip(tmp_path):
    path = save_checkpoint(tmp_path, 1)
    draws = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(load_checkpoint(path)["trainer_state"]["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == draws
    assert set(rng_state()) == {"python", "numpy", "torch", "cuda"}


def test_saving_an_iteration_again_keeps_the_old_copy_until_the_new_one_is_in(tmp_path, monkeypatch):
    """`commit_checkpoint` renames the old copy aside, the new one in, and only then deletes the old one: a
    death in between leaves both copies, and the next listing puts the complete one back as iter_X."""
    save_checkpoint(tmp_path, 3, extra={"copy": "first"})
    real = os.replace

    def replace(src, dst):
        if os.path.basename(src).startswith(".tmp-"):
            raise KeyboardInterrupt("killed")
        real(src, dst)

    tmp = staging_dir(tmp_path, 3)
    (tmp / "state.json").write_text('{"iteration": 3, "copy": "second"}')
    monkeypatch.setattr(os, "replace", replace)  # the one `os.replace` every module calls
    with pytest.raises(KeyboardInterrupt):
        commit_checkpoint(tmp, 3)
    monkeypatch.setattr(os, "replace", real)
    parent = tmp_path / "checkpoints"
    assert sorted(p.name.rsplit("-", 1)[0] for p in parent.iterdir()) == [
        ".old-iter_000003",
        ".tmp-iter_000003",
    ]
    dead = 999_999_999  # no such process: the copies are what a killed save left
    for p in list(parent.iterdir()):
        p.rename(parent / f"{p.name.rsplit('-', 1)[0]}-{dead}")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["iter_000003"]
    assert load_checkpoint(latest_checkpoint(tmp_path))["state"]["copy"] == "second"


def test_pruning_keeps_the_checkpoint_just_written_even_below_newer_ones(tmp_path):
    save_checkpoint(tmp_path, 8)
    save_checkpoint(tmp_path, 6, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["iter_000006"]
