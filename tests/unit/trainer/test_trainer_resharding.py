"""Sharded checkpoints resume on another number of ranks (torch.distributed.checkpoint; gloo on CPU).

Two updates, a checkpoint, a fresh worker on another number of ranks loads it and runs the third update: its
weights AND its AdamW moments equal those of one process that ran all three updates without stopping. Ranks
take uneven shares of every mini-batch with the global totals (as in test_trainer_fsdp.py), so the only
difference between the runs is the order of floating-point sums.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.distributed.tensor import DTensor
from trainer_helpers import make_samples, spawn_ranks

from ascent.models.parallel import fsdp_parallelize, full_state_dict
from ascent.trainer import CriticWorker, LossSettings, OptimSettings, PolicyWorker, minibatch_totals
from ascent.trainer.checkpoint import read_trainer_state, rng_state
from ascent.trainer.sharded_state import CheckpointFormatError

MAX_TOKENS = 24
CUT = 3  # of 2 ranks, rank 0 gets samples [:3] of each mini-batch, rank 1 the other 5


def _mini_batches():
    samples = make_samples(24, seed=5)
    samples = [
        replace(s, returns=[1.0 if i % 2 else -1.0] * len(s.response_ids)) for i, s in enumerate(samples)
    ]
    return [samples[0:8], samples[8:16], samples[16:24]]


def _worker(kind: str, path: str, sharded_alone: bool = False):
    """A policy (AdamW on the device) or a critic (AdamW offloaded to the CPU); train.sharding=fsdp, which
    shards only with several ranks, unless `sharded_alone` (FSDP2 over a 1-rank group)."""
    kw = {"max_tokens_per_micro_batch": MAX_TOKENS, "sharding": "fsdp", "seed": 0, "device": "cpu"}
    if sharded_alone:
        kw["parallelize"] = fsdp_parallelize(torch.float32, torch.float32)
    if kind == "policy":
        loss = LossSettings(loss_aggregation="seq-mean-token-mean")
        return PolicyWorker(path, optim=OptimSettings(lr=1e-2, eps=1e-4), loss=loss, **kw)
    return CriticWorker(path, optim=OptimSettings(lr=1e-2, eps=1e-4, offload=True), **kw)


def _train(worker, batches, rank: int, world: int) -> None:
    for mb in batches:
        share = mb if world == 1 else (mb[:CUT] if rank == 0 else mb[CUT:])
        worker.update(share, **dict(zip(("total_tokens", "total_seqs"), minibatch_totals(mb), strict=True)))


def _snapshot(worker) -> dict:
    """Full weights and full AdamW state by parameter name (gathered on every rank: a collective)."""
    model = getattr(worker, "value_model", worker.model)
    weights = {k: v.detach().cpu().clone() for k, v in full_state_dict(model, rank0_only=False).items()}
    full = StateDictOptions(full_state_dict=True)
    osd = get_optimizer_state_dict(worker.model, worker.optimizer, options=full)
    moments = {
        n: {k: torch.as_tensor(v).detach().cpu().clone() for k, v in s.items()}
        for n, s in osd["state"].items()
    }
    return {"weights": weights, "moments": moments, "step": worker.step}


@contextlib.contextmanager
def _group(rank: int, world: int, port: int):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
        dist.barrier()  # no rank tears gloo down while another still works (it aborted rank 1 once in CI)
    finally:
        dist.destroy_process_group()


def _save_part(rank, world, port, jobs, path, sharded_alone=False):
    """On each rank, for each (kind, checkpoint) of `jobs` in turn: a fresh worker runs updates 1 and 2, then
    writes a checkpoint with the DCP shards only (no gathered HF weights)."""
    with _group(rank, world, port):
        for kind, ckpt in jobs:
            worker = _worker(kind, path, sharded_alone)
            assert worker.sharded
            _train(worker, _mini_batches()[:2], rank, world)
            worker.save(ckpt, hf_weights=False)


def _resume_part(rank, world, port, kind, path, jobs):
    """On each rank, for each (checkpoint, out) of `jobs` in turn: a fresh worker loads the checkpoint, runs
    update 3 and snapshots (rank 0 writes it to `out`). One group serves several checkpoints: a process start
    fewer, the same resume for each."""
    with _group(rank, world, port):
        for ckpt, out in jobs:
            worker = _worker(kind, path)
            worker.load(ckpt)
            _train(worker, _mini_batches()[2:], rank, world)
            snap = _snapshot(worker)
            if rank == 0:
                torch.save(snap, out)


def _write_old_format(directory, optimizer) -> None:
    """This rank's optimizer as checkpoints held it before DCP: `optimizer_rank*.pt`, DTensor moments as local
    shards, their (index, key) pairs, the world size and the RNG."""
    sd = optimizer.state_dict()
    keys = [[i, k] for i, s in sd["state"].items() for k, v in s.items() if isinstance(v, DTensor)]
    state = {
        i: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in s.items()}
        for i, s in sd["state"].items()
    }
    blob = {"optimizer": {**sd, "state": state}, "dtensor_keys": keys, "world_size": 2, "rng": rng_state()}
    torch.save(blob, Path(directory) / f"optimizer_rank{dist.get_rank():05d}.pt")


def _old_format_part(rank, world, port, path, ckpt, out):
    """A 2-rank checkpoint in the old per-rank optimizer format, resumed on the same 2 ranks."""
    with _group(rank, world, port):
        worker = _worker("policy", path)
        _train(worker, _mini_batches()[:2], rank, world)
        worker.save(ckpt, hf_weights=False)
        dist.barrier()
        if rank == 0:
            shutil.rmtree(Path(ckpt) / "optimizer_shards")
        _write_old_format(ckpt, worker.optimizer)
        dist.barrier()
        resumed = _worker("policy", path)
        resumed.load(ckpt)
        _train(resumed, _mini_batches()[2:], rank, world)
        snap = _snapshot(resumed)
        if rank == 0:
            torch.save(snap, out)


def _save_before_any_step_part(rank, world, port, path, ckpt, out):
    """FSDP over the ranks: a checkpoint before the first update (the policy during critic warm-up), then
    the three updates; and a fresh worker that resumes that checkpoint and runs them too."""
    with _group(rank, world, port):
        worker = _worker("policy", path, sharded_alone=True)
        worker.save(ckpt, hf_weights=False)
        assert not worker.optimizer.state  # no zero-gradient step to create it, so AdamW's step count stays 0
        _train(worker, _mini_batches(), rank, world)
        resumed = _worker("policy", path, sharded_alone=True)
        resumed.load(ckpt)
        assert not resumed.optimizer.state
        _train(resumed, _mini_batches(), rank, world)
        snaps = [_snapshot(worker), _snapshot(resumed)]
        if rank == 0:
            torch.save(snaps, out)


def _spawn(fn, world, *args) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spawn_ranks(fn, (world, port, *args), world)


def _uninterrupted(kind: str, path) -> dict:
    worker = _worker(kind, str(path))
    _train(worker, _mini_batches(), 0, 1)
    return _snapshot(worker)


def _assert_same(got: dict, want: dict, atol: float = 1e-5) -> None:
    assert got["step"] == want["step"] == 3
    assert got["weights"].keys() == want["weights"].keys()
    for name, t in want["weights"].items():
        torch.testing.assert_close(got["weights"][name], t, atol=atol, rtol=0, msg=name)
    assert got["moments"].keys() == want["moments"].keys()
    for name, state in want["moments"].items():
        assert set(got["moments"][name]) == set(state) >= {"exp_avg", "exp_avg_sq", "step"}, name
        for key, t in state.items():
            # second moments are squares of gradients: tolerance relative to them
            torch.testing.assert_close(
                got["moments"][name][key], t, atol=atol, rtol=1e-4, msg=f"{name} {key}"
            )


@pytest.fixture(scope="module")
def two_rank_checkpoints(tiny_path, tmp_path_factory) -> dict[str, Path]:
    """kind -> the checkpoint 2 FSDP ranks wrote after updates 1 and 2: the policy's and the critic's, each by
    its own fresh workers in one 2-rank spawn (one process start for both). The tests only read them."""
    root = tmp_path_factory.mktemp("two_rank_ckpts")
    ckpts = {kind: root / kind for kind in ("policy", "critic")}
    _spawn(_save_part, 2, [(k, str(c)) for k, c in ckpts.items()], str(tiny_path))
    return ckpts


@pytest.mark.parametrize("kind", ["policy", "critic"])
def test_two_sharded_ranks_resume_on_one(tiny_path, kind, two_rank_checkpoints):
    """2 FSDP ranks -> 1 process (unsharded): weights and moments from the DCP shards alone."""
    ckpt = two_rank_checkpoints[kind]
    part = ckpt / "critic" if kind == "critic" else ckpt
    assert (part / "model_shards" / ".metadata").is_file()
    assert (part / "optimizer_shards" / ".metadata").is_file()
    assert not list(part.glob("*.safetensors")) and not list(part.glob("optimizer_rank*"))
    assert read_trainer_state(part)["optimizer"] is None  # nothing gathered
    if kind == "policy":
        assert sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == ["rng_rank00000.pt", "rng_rank00001.pt"]
    resumed = _worker(kind, str(tiny_path))
    assert not resumed.sharded
    resumed.load(ckpt)
    _train(resumed, _mini_batches()[2:], 0, 1)
    _assert_same(_snapshot(resumed), _uninterrupted(kind, tiny_path))


def test_one_rank_resumes_on_two_sharded_ranks(tiny_path, tmp_path):
    """1 -> 2 both ways a single process writes: unsharded (HF weights + the full optimizer in
    trainer_state.pt, cut into shards on load) and FSDP over a 1-rank group (DCP shards, resliced)."""
    want = _uninterrupted("policy", tiny_path)
    plain = tmp_path / "plain"
    worker = _worker("policy", str(tiny_path))
    _train(worker, _mini_batches()[:2], 0, 1)
    worker.save(plain)
    assert read_trainer_state(plain)["optimizer"] is not None

    alone = tmp_path / "alone"
    _spawn(_save_part, 1, [("policy", str(alone))], str(tiny_path), True)
    assert (alone / "optimizer_shards" / ".metadata").is_file()
    jobs = [(str(ckpt), str(tmp_path / f"from_{ckpt.name}.pt")) for ckpt in (plain, alone)]
    _spawn(_resume_part, 2, "policy", str(tiny_path), jobs)  # both resumes, each by a fresh worker
    _assert_same(torch.load(tmp_path / "from_plain.pt", weights_only=True), want)
    _assert_same(torch.load(tmp_path / "from_alone.pt", weights_only=True), want)


def test_per_rank_optimizer_files_of_old_checkpoints_name_the_rank_count(tiny_path, tmp_path):
    """Checkpoints from before DCP (optimizer_rank*.pt) load only on their own number of sharded ranks;
    anything else is refused with that number, not resumed with fresh moments."""
    old = tmp_path / "old"
    _spawn(_old_format_part, 2, str(tiny_path), str(old), str(tmp_path / "old.pt"))
    assert not (old / "optimizer_shards").exists() and len(list(old.glob("optimizer_rank*.pt"))) == 2
    _assert_same(torch.load(tmp_path / "old.pt", weights_only=True), _uninterrupted("policy", tiny_path))
    with pytest.raises(CheckpointFormatError, match="cluster.num_trainer_workers=2"):
        _worker("policy", str(tiny_path)).load(old)  # one unsharded process


def test_a_save_before_the_first_step_leaves_the_optimizer_untouched(tiny_path, tmp_path):
    """torch's get_optimizer_state_dict initialises an empty optimizer with a zero-gradient step (AdamW's
    step count 1): a sharded save before any update writes no optimizer shards instead, and a resume of it
    starts a fresh optimizer. Both runs then match one that never saved."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "snaps.pt"
    _spawn(_save_before_any_step_part, 1, str(tiny_path), str(ckpt), str(out))
    assert not (ckpt / "optimizer_shards").exists()
    assert read_trainer_state(ckpt)["optimizer_fresh"] is True
    want = _uninterrupted("policy", tiny_path)
    for snap in torch.load(out, weights_only=True):
        for state in snap["moments"].values():
            assert float(state["step"]) == 3.0
        _assert_same(snap, want)
