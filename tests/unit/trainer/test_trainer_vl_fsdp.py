"""FSDP2 on a vision-language policy (CPU, gloo, two ranks): the wrapping finds the vision blocks and the
decoder layers, a frozen vision tower shards beside trained weights, and image samples give the logprobs,
update and weights of one unsharded process."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from trainer_helpers import spawn_ranks
from transformers import AutoTokenizer

from ascent.messages import TrainSample
from ascent.models.parallel import decoder_layers, full_state_dict
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from ascent.models.vision import load_image_codec
from ascent.trainer import OptimSettings, PolicyWorker, minibatch_totals
from tests.unit.vl_support import image_prompt


def _samples(path) -> list[TrainSample]:
    codec, tokenizer = load_image_codec(path), AutoTokenizer.from_pretrained(path)
    response = tokenizer.encode("abcdef")
    out = []
    for i, k in enumerate((1, 2, 0, 1)):
        ids, images = image_prompt(codec, tokenizer, k, seed=i)
        r = response[: 3 + i]
        out.append(TrainSample(ids, r, [1] * len(r), [0.5 - 0.3 * i] * len(r), images=images))
    return out


def _run(path, sharding, share):
    worker = PolicyWorker(
        path,
        device="cpu",
        optim=OptimSettings(lr=1e-2, eps=1e-4),
        freeze_vision_tower=True,
        sharding=sharding,
        max_tokens_per_micro_batch=200,
        seed=0,
    )
    samples = _samples(path)
    logprobs = worker.compute_logprobs(share(samples))
    totals = dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))
    metrics = worker.update(share(samples), **totals)
    weights = {k: v.cpu() for k, v in full_state_dict(worker.model, rank0_only=False).items()}
    return {"logprobs": logprobs, "grad_norm": metrics["grad_norm"], "weights": weights}


def _rank(rank, port, path, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        result = _run(path, "fsdp", lambda s: s[:1] if rank == 0 else s[1:])
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp_two_ranks_match_one_process_with_images(tmp_path):
    from ascent.models.loading import load_model

    path = make_tiny_vl_checkpoint(tmp_path / "vl", family="qwen3_vl", seed=2)
    kinds = {type(m).__name__ for m in decoder_layers(load_model(path, device="cpu"))}
    assert kinds == {"Qwen3VLVisionBlock", "Qwen3VLTextDecoderLayer"}
    spawn_ranks(_rank, (_free_port(), str(path), str(tmp_path)), 2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    single = _run(path, "none", lambda s: s)
    for got, want in zip(ranks[0]["logprobs"] + ranks[1]["logprobs"], single["logprobs"], strict=True):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)
    assert ranks[0]["grad_norm"] == ranks[1]["grad_norm"]
    assert abs(ranks[0]["grad_norm"] - single["grad_norm"]) < 1e-4 * single["grad_norm"]
    initial = load_model(path, device="cpu").state_dict()
    for name, t in single["weights"].items():
        for r in ranks:
            torch.testing.assert_close(r["weights"][name], t, atol=1e-5, rtol=0, msg=name)
        assert torch.equal(t, initial[name]) is name.startswith("model.visual."), name
