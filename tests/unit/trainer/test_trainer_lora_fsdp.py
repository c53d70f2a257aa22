"""LoRA on a sharded policy (FSDP2 over gloo, two ranks with uneven shares) against one unsharded process:
reference logprobs (adapters off, ranks in lock-step), updates, merged weights for the engine, and
checkpoints whose adapters go through torch.distributed.checkpoint (resumed on 2 ranks and on 1) or, when an
export is due, gathered to rank 0 as a PEFT adapter plus merged HF weights."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from trainer_helpers import make_samples, spawn_ranks

from ascent.trainer import LoraSettings, LossSettings, OptimSettings, PolicyWorker, minibatch_totals
from ascent.trainer.lora import ADAPTER_DIR
from ascent.trainer.lora_sharded import ADAPTER_SHARDS_DIR

pytest.importorskip("peft")

CUT = 2  # of 2 ranks, rank 0 gets samples [:2] of each mini-batch, rank 1 the other 6


def _worker(path: str) -> PolicyWorker:
    lora = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "up_proj"))
    return PolicyWorker(
        path,
        device="cpu",
        lora=lora,
        optim=OptimSettings(lr=5e-2),
        loss=LossSettings(kl_loss_coef=0.05),
        max_tokens_per_micro_batch=24,
        sharding="fsdp",
        seed=0,
    )


def _mini_batches():
    s = make_samples(24, seed=4)
    return [s[0:8], s[8:16], s[16:24]]


def _share(samples, rank: int, world: int):
    return samples if world == 1 else (samples[:CUT] if rank == 0 else samples[CUT:])


def _train(worker, batches, rank: int, world: int) -> None:
    for mb in batches:
        tokens, seqs = minibatch_totals(mb)
        worker.update(_share(mb, rank, world), total_tokens=tokens, total_seqs=seqs)


def _snapshot(worker) -> dict:
    """Merged weights (what the engine gets) and AdamW's moments of the adapters, full (a collective)."""
    weights = {n: t.clone() for n, t in worker.named_weights()}
    osd = get_optimizer_state_dict(
        worker.model, worker.optimizer, options=StateDictOptions(full_state_dict=True)
    )
    moments = {n: {k: torch.as_tensor(v).clone() for k, v in s.items()} for n, s in osd["state"].items()}
    return {"weights": weights, "moments": moments, "step": worker.step}


def _ranks(rank: int, world: int, port: int, path: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        worker = _worker(path)
        assert worker.sharded
        ref = worker.compute_logprobs(_share(make_samples(8, seed=9), rank, world), which="reference")
        _train(worker, _mini_batches()[:2], rank, world)
        worker.save(os.path.join(out, "shards"), hf_weights=False)
        worker.save(os.path.join(out, "export"), hf_weights=True)
        trained = _snapshot(worker)
        resumed = _worker(path)
        resumed.load(os.path.join(out, "shards"))
        _train(resumed, _mini_batches()[2:], rank, world)
        from_one = _worker(path)  # 1 process -> 2 ranks: the PEFT adapter and the full optimizer, cut up
        from_one.load(os.path.join(out, "single_export"))
        _train(from_one, _mini_batches()[2:], rank, world)
        result = {
            "ref": ref,
            "trained": trained,
            "resumed": _snapshot(resumed),
            "from_one": _snapshot(from_one),
        }
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while another still works (it aborted the process)
    finally:
        dist.destroy_process_group()


def _assert_same(got: dict, want: dict, atol: float = 1e-5) -> None:
    assert got["step"] == want["step"]
    assert got["weights"].keys() == want["weights"].keys()
    for name, t in want["weights"].items():
        torch.testing.assert_close(got["weights"][name], t, atol=atol, rtol=0, msg=name)
    assert got["moments"].keys() == want["moments"].keys() and want["moments"]
    for name, state in want["moments"].items():
        for key, t in state.items():
            torch.testing.assert_close(
                got["moments"][name][key], t, atol=atol, rtol=1e-4, msg=f"{name} {key}"
            )


def test_lora_fsdp_matches_one_process_and_resumes_from_adapter_shards(tiny_path, tmp_path):
    single_export = tmp_path / "single_export"
    trained_single = _worker(str(tiny_path))
    _train(trained_single, _mini_batches()[:2], 0, 1)
    trained_single.save(single_export)
    assert not (single_export / ADAPTER_SHARDS_DIR).exists()  # unsharded: the PEFT adapter is the state
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spawn_ranks(_ranks, (2, port, str(tiny_path), str(tmp_path)), 2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    single = _worker(str(tiny_path))
    ref = single.compute_logprobs(make_samples(8, seed=9), which="reference")
    for a, b in zip(ranks[0]["ref"] + ranks[1]["ref"], ref, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    _train(single, _mini_batches()[:2], 0, 1)
    trained = _snapshot(single)
    for r in ranks:  # the merged weights every rank gathered for the engine
        _assert_same(r["trained"], trained)
    _train(single, _mini_batches()[2:], 0, 1)
    uninterrupted = _snapshot(single)
    _assert_same(ranks[0]["resumed"], uninterrupted)  # 2 ranks -> 2 ranks, from the shards alone
    _assert_same(ranks[0]["from_one"], uninterrupted)

    shards, export = tmp_path / "shards", tmp_path / "export"
    assert (shards / ADAPTER_SHARDS_DIR / ".metadata").is_file()
    assert (shards / "optimizer_shards" / ".metadata").is_file()
    assert (
        not list(shards.rglob("*.safetensors")) and not (shards / "model_shards").exists()
    )  # base: model.path
    assert (shards / ADAPTER_DIR / "adapter_config.json").is_file()

    alone = _worker(str(tiny_path))  # 2 ranks -> 1 process
    alone.load(shards)
    _train(alone, _mini_batches()[2:], 0, 1)
    _assert_same(_snapshot(alone), uninterrupted)

    # the export: a PEFT adapter and merged weights, gathered by rank 0, equal to the unsharded ones
    want = load_file(str(single_export / ADAPTER_DIR / "adapter_model.safetensors"))
    got = load_file(str(export / ADAPTER_DIR / "adapter_model.safetensors"))
    assert got.keys() == want.keys() and got
    # two Adam steps at lr 5e-2 turn the ranks' other summation order into adapter differences of up to
    # 9.8e-6 (AVX-512, 2 threads; 1.7e-6 on the SSE4.2 path at 1 thread): 1e-5 was one CPU away from failing.
    # A rank's gradient lost or doubled, or a misplaced shard, moves entries by ~lr.
    for name, t in want.items():
        torch.testing.assert_close(got[name], t, atol=1e-4, rtol=0, msg=name)
    merged = load_file(str(export / "model.safetensors"))
    for name, t in load_file(str(single_export / "model.safetensors")).items():
        torch.testing.assert_close(merged[name], t, atol=1e-4, rtol=0, msg=name)
    assert (export / ADAPTER_SHARDS_DIR / ".metadata").is_file()  # the resume state, export or not
