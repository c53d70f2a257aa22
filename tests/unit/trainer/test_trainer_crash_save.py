"""A trainer killed in the middle of a sharded save leaves the previous checkpoint whole and loadable.

Two FSDP ranks (gloo on CPU) save through the controller's `checkpointing.commit`, as a run does (rank 0
plays the controller and hands the staging directory to rank 1, like a Ray call to every trainer rank).
The second save is killed with SIGKILL while torch.distributed.checkpoint writes the weight shards: the
ranks' data files are on disk, the DCP metadata and the rest of the checkpoint are not.
"""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemWriter
from trainer_helpers import make_samples, spawn_ranks

from ascent.models.parallel import full_state_dict
from ascent.orchestrator import checkpointing
from ascent.trainer import LossSettings, OptimSettings, PolicyWorker, minibatch_totals


def _policy(path: str) -> PolicyWorker:
    loss = LossSettings(loss_aggregation="seq-mean-token-mean")
    kw = {"max_tokens_per_micro_batch": 24, "sharding": "fsdp", "seed": 0, "device": "cpu"}
    return PolicyWorker(path, optim=OptimSettings(lr=1e-2, eps=1e-4), loss=loss, **kw)


def _update(worker: PolicyWorker, rank: int, world: int, seed: int) -> None:
    mb = make_samples(8, seed=seed)
    share = mb if world == 1 else mb[rank::world]
    worker.update(share, **dict(zip(("total_tokens", "total_seqs"), minibatch_totals(mb), strict=True)))


def _save(worker: PolicyWorker, run_dir: str, iteration: int, rank: int) -> None:
    """Rank 0: `checkpointing.commit`, whose writer sends the staging directory to rank 1 and saves; rank 1:
    the same save into the directory it receives (the trainer ranks of a run save concurrently)."""

    def write(tmp: str) -> None:
        dist.broadcast_object_list([tmp], src=0)
        worker.save(tmp, hf_weights=False)

    if rank == 0:
        checkpointing.commit(
            run_dir, iteration, [write], {"sampler": {"seen": iteration}, "config": {}}, keep_last=2
        )
    else:
        got: list = [None]
        dist.broadcast_object_list(got, src=0)
        worker.save(got[0], hf_weights=False)
    dist.barrier()


def _kill_in_dcp_finish(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # after every rank wrote its .distcp data, before .metadata


def _ranks(rank: int, world: int, port: int, path: str, run_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    worker = _policy(path)
    _update(worker, rank, world, seed=1)
    _save(worker, run_dir, 1, rank)
    saved = {k: v.clone() for k, v in full_state_dict(worker.model, rank0_only=False).items()}
    if rank == 0:
        torch.save(saved, out)
    _update(worker, rank, world, seed=2)
    if rank == 0:
        FileSystemWriter.finish = _kill_in_dcp_finish  # type: ignore[method-assign]
    _save(worker, run_dir, 2, rank)  # never returns: rank 0 dies, mp.spawn ends rank 1
    raise AssertionError("the save of iteration 2 should have been killed")


def test_killed_mid_save_leaves_the_previous_checkpoint_loadable(tiny_path, tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "saved_at_1.pt"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        spawn_ranks(_ranks, (2, port, str(tiny_path), str(run_dir), str(out)), 2)
    half = run_dir / "checkpoints" / ".tmp_iter_000002"
    assert len(list((half / "model_shards").glob("*.distcp"))) == 2  # the kill came mid-save
    assert not (half / "model_shards" / ".metadata").exists() and not (half / "state.json").exists()

    found = checkpointing.latest(run_dir)  # verifies every file of the checkpoint it picks
    assert found is not None
    path, state = found
    assert path.name == "iter_000001" and state["sampler"] == {"seen": 1}
    resumed = _policy(str(tiny_path))  # one process now: the 2-rank shards load unsharded
    resumed.load(path)
    assert resumed.step == 1
    want = torch.load(out, weights_only=True)
    got = resumed.model.state_dict()
    for name, t in want.items():
        torch.testing.assert_close(got[name], t, atol=0, rtol=0, msg=name)

    # the run goes on: the next save of iteration 2 replaces the half-written staging directory
    _update(resumed, 0, 1, seed=2)
    final = checkpointing.commit(run_dir, 2, [resumed.save], {}, keep_last=2)
    assert [p.name for p in checkpointing.checkpoint_dirs(run_dir)] == ["iter_000001", "iter_000002"]
    assert json.loads((final / "state.json").read_text())["iteration"] == 2
    assert not half.exists()
