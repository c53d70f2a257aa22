"""FSDP2 on CPU with gloo: two sharded ranks, each on an uneven share of every mini-batch with the global
totals, match one unsharded process on the whole mini-batch (logprobs, values, updates, save -> load ->
update, gathered weights); optimizer offload matches plain AdamW; the bucketed gather matches full_tensor.
Resuming on another number of ranks: test_trainer_resharding.py."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from trainer_helpers import make_samples, spawn_ranks

from ascent.config.schema import TrainConfig
from ascent.models import load_model
from ascent.models.parallel import full_state_dict, fully_shard_model, gather_full
from ascent.trainer import CriticWorker, LossSettings, OptimSettings, PolicyWorker, minibatch_totals
from ascent.trainer import sharded as sharded_lib
from ascent.trainer.offload import OffloadedAdamW
from ascent.trainer.packing import plan_micro_batches

MAX_TOKENS = 24
CUT = 3  # rank 0 gets samples [:3] of each mini-batch, rank 1 the other 5: different micro-batch counts


def _samples():
    samples = make_samples(24, seed=5)
    return [replace(s, returns=[1.0 if i % 2 else -1.0] * len(s.response_ids)) for i, s in enumerate(samples)]


def _mini_batches():
    s = _samples()
    return [s[0:8], s[8:16], s[16:24]]


def _totals(mb):
    return dict(zip(("total_tokens", "total_seqs"), minibatch_totals(mb), strict=True))


def _policy(path, sharding, offload=False, device="cpu"):
    loss = LossSettings(loss_aggregation="seq-mean-token-mean")
    optim = OptimSettings(lr=1e-2, eps=1e-4, offload=offload)
    kw = {"max_tokens_per_micro_batch": MAX_TOKENS, "sharding": sharding, "seed": 0}
    return PolicyWorker(path, device=device, optim=optim, loss=loss, **kw)


def _critic(path, sharding, offload=False, device="cpu"):
    optim = OptimSettings(lr=1e-2, eps=1e-4, offload=offload)
    kw = {"max_tokens_per_micro_batch": MAX_TOKENS, "sharding": sharding, "seed": 0}
    return CriticWorker(path, device=device, optim=optim, **kw)


def _run(make, share, ckpt, forward, hf_weights=True):
    """forward on all samples, 2 updates, save, a fresh worker loads and does update 3 -> results."""
    worker = make()
    out = forward(worker, share(_samples()))
    metrics = [worker.update(share(mb), **_totals(mb)) for mb in _mini_batches()[:2]]
    worker.save(ckpt, hf_weights=hf_weights)
    resumed = make()
    resumed.load(ckpt)
    metrics.append(resumed.update(share(_mini_batches()[2]), **_totals(_mini_batches()[2])))
    model = getattr(resumed, "value_model", resumed.model)
    weights = {k: v.cpu() for k, v in full_state_dict(model, rank0_only=False).items()}
    return {"out": out, "metrics": metrics, "weights": weights}


def _policy_logprobs(worker, samples):
    return worker.compute_logprobs(samples)


def _critic_values(worker, samples):
    return worker.compute_values(samples)


def _check_gather(rank):
    """Odd shapes (rank 1 holds no row of a [1, 3] weight), tiny buckets: bucketed == full_tensor()."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 1), nn.Linear(1, 7))
    fully_shard_model(model)
    params = list(model.named_parameters())
    for name, full in gather_full(params, bucket_elems=7):
        torch.testing.assert_close(full, dict(params)[name].full_tensor(), atol=0, rtol=0)


def _run_rank(rank, world, port, path, out_dir, device_type="cpu"):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = "cpu"
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world)
    try:

        def share(samples):
            return samples[:CUT] if rank == 0 else samples[CUT:]

        if device_type == "cpu":
            _check_gather(rank)
        ckpt = os.path.join(out_dir, "ckpt")
        make_policy = lambda: _policy(path, "fsdp", device=device)  # noqa: E731
        policy = _run(make_policy, share, ckpt, _policy_logprobs)
        shards_only = _run(make_policy, share, os.path.join(out_dir, "ckpt_shards"), _policy_logprobs, False)
        critic_ckpt = os.path.join(out_dir, "ckpt_critic")
        make_critic = lambda: _critic(path, "fsdp", offload=True, device=device)  # noqa: E731
        critic = _run(make_critic, share, critic_ckpt, _critic_values)
        critic_shards = _run(
            make_critic, share, os.path.join(out_dir, "ckpt_critic_shards"), _critic_values, False
        )
        results = {
            "policy": policy,
            "policy_shards": shards_only,
            "critic": critic,
            "critic_shards": critic_shards,
        }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while another still works (it aborted the process)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_match(single, ranks, atol=1e-5):
    got_out = ranks[0]["out"] + ranks[1]["out"]  # rank 0 had the first CUT samples, rank 1 the rest
    for a, b in zip(got_out, single["out"], strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=atol, rtol=0)
    for got, want in zip(ranks[0]["metrics"], single["metrics"], strict=True):
        for key in want.keys() - {"micro_batches"}:  # the only split-dependent metric
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6, nan_ok=True), key
    assert ranks[0]["weights"].keys() == single["weights"].keys()
    for name, t in single["weights"].items():
        for r in ranks:
            torch.testing.assert_close(r["weights"][name], t, atol=atol, rtol=0, msg=name)


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (nvidia-h200-x2)")


@pytest.mark.gpu
@TWO_GPUS
def test_fsdp_two_gpus_nccl_match_one_gpu(tiny_path, tmp_path):
    """The same equivalence over NCCL on two GPUs (fp32 compute; GPU reduction order allows 1e-4)."""
    spawn_ranks(_run_rank, (2, _free_port(), str(tiny_path), str(tmp_path), "cuda"), 2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    single = _run(
        lambda: _policy(tiny_path, "none", device="cuda:0"),
        lambda s: s,
        tmp_path / "single",
        _policy_logprobs,
    )
    _assert_match(single, [r["policy"] for r in ranks], atol=1e-4)


def test_fsdp_two_ranks_match_one_process(tiny_path, tmp_path):
    counts = [
        [len(plan_micro_batches([s.num_tokens for s in part], MAX_TOKENS)) for part in (mb[:CUT], mb[CUT:])]
        for mb in _mini_batches()
    ]
    assert any(a != b for a, b in counts), counts  # the lock-step fillers are exercised
    spawn_ranks(_run_rank, (2, _free_port(), str(tiny_path), str(tmp_path)), 2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    def whole(samples):
        return samples

    single_policy = _run(lambda: _policy(tiny_path, "none"), whole, tmp_path / "single", _policy_logprobs)
    single_critic = _run(lambda: _critic(tiny_path, "none"), whole, tmp_path / "single_c", _critic_values)
    _assert_match(single_policy, [r["policy"] for r in ranks])
    _assert_match(single_critic, [r["critic"] for r in ranks])
    # checkpoint.hf_weights=last: each rank's shards alone (nothing gathered) resume the run just the same
    _assert_match(single_policy, [r["policy_shards"] for r in ranks])
    _assert_match(single_critic, [r["critic_shards"] for r in ranks])
    for shards_only in (tmp_path / "ckpt_shards", tmp_path / "ckpt_critic_shards" / "critic"):
        assert (shards_only / "model_shards" / ".metadata").is_file()
        assert not list(shards_only.glob("*.safetensors"))  # no gathered weights were written
    assert sorted(p.name for p in (tmp_path / "ckpt_shards" / "model_shards").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    # the sharded checkpoint is also a plain HF checkpoint (rank 0 wrote gathered weights); the optimizer is
    # in
    # DCP shards (one file per rank), RNG states one file per rank
    ckpt = tmp_path / "ckpt"
    assert json.loads((ckpt / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert len(list((ckpt / "optimizer_shards").glob("*.distcp"))) == 2
    assert sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == ["rng_rank00000.pt", "rng_rank00001.pt"]
    saved = load_model(ckpt, dtype="fp32", device="cpu").state_dict()
    for name, t in load_model(tmp_path / "single", dtype="fp32", device="cpu").state_dict().items():
        torch.testing.assert_close(saved[name], t, atol=1e-5, rtol=0, msg=name)


def test_offload_update_matches_plain_adamw(tiny_path, tmp_path):
    plain, offloaded = _policy(tiny_path, "none"), _policy(tiny_path, "none", offload=True)
    assert isinstance(offloaded.optimizer, OffloadedAdamW)
    for mb in _mini_batches()[:2]:
        a = plain.update(mb, **_totals(mb))
        b = offloaded.update(mb, **_totals(mb))
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    offloaded.save(tmp_path)
    resumed = _policy(tiny_path, "none", offload=True)
    resumed.load(tmp_path)
    mb = _mini_batches()[2]
    plain.update(mb, **_totals(mb))
    resumed.update(mb, **_totals(mb))
    want = dict(plain.named_weights())
    for name, t in resumed.named_weights():
        torch.testing.assert_close(t, want[name], atol=1e-6, rtol=0, msg=name)
    assert resumed.optimizer.param_groups[0]["lr"] == plain.optimizer.param_groups[0]["lr"]


def test_sharding_settings(monkeypatch):
    assert TrainConfig(sharding="fsdp", offload_optimizer=True).sharding == "fsdp"
    with pytest.raises(ValueError):
        TrainConfig(sharding="zero3")
    kw = {"param_dtype": torch.float32, "compute_dtype": torch.bfloat16, "lora": False}
    assert sharded_lib.sharding_parallelize("fsdp", **kw) is None  # a single rank: nothing to shard
    monkeypatch.setattr(sharded_lib, "world_size", lambda: 2)
    assert callable(sharded_lib.sharding_parallelize("fsdp", **kw))
    assert callable(
        sharded_lib.sharding_parallelize("fsdp", **{**kw, "lora": True})
    )  # test_trainer_lora_fsdp
    with pytest.raises(ValueError, match="bf16"):
        sharded_lib.sharding_parallelize("fsdp", **{**kw, "compute_dtype": torch.float16})
    with pytest.raises(ValueError, match="train.sharding='zero3'"):
        sharded_lib.sharding_parallelize("zero3", **kw)
