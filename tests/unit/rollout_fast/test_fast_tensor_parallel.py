"""Tensor-parallel fast engine on CPU with gloo: two ranks of one replica generate exactly what one process
generates (greedy tokens equal, logprobs within 1e-4), with KV heads split (2 KV heads) and replicated (1 KV
head), on a prefix-cached second turn, and after a sleep that released the weights and a publication of new
ones (each rank receiving its shard). The sharding itself (slices that put the model back together, the KV
head a rank reads) is checked without processes. On CPU the launcher forks the other rank (cheap: spawned
processes import transformers again)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.models.families import ModelSpec
from ascent.rollout.fast import TPEngine, build_fast_engine
from ascent.rollout.fast.tp_shard import shard_spec, shard_state_dict, shard_tensor
from ascent.rollout.fast.weights import load_state_dict

HEAD_SCALE = 10.0  # a sharper head than random init: varied, peaked greedy outputs (as conftest.py)


def _spec(nh: int = 4, kvh: int = 2, inter: int = 256) -> ModelSpec:
    return ModelSpec("qwen2", 50, 64, inter, 2, nh, kvh, 16, 1e-6, 512, False)


def test_shards_put_the_model_back_together():
    spec, g = _spec(), torch.Generator().manual_seed(0)
    names = {
        "model.layers.0.self_attn.q_proj.weight": (64, 64),
        "model.layers.0.self_attn.k_proj.bias": (32,),
        "model.layers.0.self_attn.o_proj.weight": (64, 64),
        "model.layers.0.mlp.up_proj.weight": (256, 64),
        "model.layers.0.mlp.down_proj.weight": (64, 256),
        "model.norm.weight": (64,),
    }
    sd = {n: torch.randn(s, generator=g) for n, s in names.items()}
    parts = [shard_state_dict(sd, spec, r, 2) for r in range(2)]
    for n, t in sd.items():
        dim = 1 if n.endswith(("o_proj.weight", "down_proj.weight")) else 0
        if n == "model.norm.weight":  # replicated
            assert all(p[n] is t for p in parts)
        else:
            assert torch.equal(torch.cat([p[n] for p in parts], dim=dim), t)
    local = shard_spec(spec, 2)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (2, 1, 128)


def test_fewer_kv_heads_than_ranks_replicates_the_one_each_rank_reads():
    spec = _spec(nh=8, kvh=2)  # query heads 0-3 read KV head 0, 4-7 KV head 1
    k = torch.arange(32.0)[:, None].expand(32, 3)  # rows: KV head 0 = 0..15, KV head 1 = 16..31
    heads = [
        int(shard_tensor("model.layers.0.self_attn.k_proj.weight", k, spec, r, 4)[0, 0]) // 16
        for r in range(4)
    ]
    assert heads == [0, 0, 1, 1]  # rank r holds query heads 2r, 2r+1
    assert shard_spec(spec, 4).num_kv_heads == 1


def test_unsplittable_sizes_are_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel=3: .*num_attention_heads=4"):
        shard_spec(_spec(), 3)


def _requests() -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(3)
    shapes = [(9, 2, 14), (5, 1, 10), (17, 1, 12), (6, 3, 9)]  # (prompt, n, max_new)
    return [
        GenerationRequest(
            torch.randint(4, 40, (p,), generator=g).tolist(),
            SamplingParams(temperature=0.0, max_new_tokens=m, n=n),
            request_id=i,
            session_id="s" if i == 0 else None,
        )
        for i, (p, n, m) in enumerate(shapes)
    ]


def _second_turn(first) -> list[GenerationRequest]:
    """Request 0's session again: its prompt, its first response and more tokens (a cached prefix)."""
    r = _requests()[0]
    prompt = r.prompt_ids + first[0][0].token_ids + [7, 8, 9]
    return [GenerationRequest(prompt, SamplingParams(temperature=0.0, max_new_tokens=8), session_id="s")]


def _outputs(engine, requests) -> list:
    out = engine.generate(requests)
    return [[(g.token_ids, g.logprobs) for g in gens] for gens in out]


def _scenario(engine, path: str) -> dict:
    """Generation, a prefix-cached second turn, then a publication of new weights after a sleep that
    released the old ones."""
    sd = load_state_dict(path)
    engine.update_weights([("lm_head.weight", sd["lm_head.weight"] * HEAD_SCALE)])
    first = engine.generate(_requests())
    res = {"first": [[(g.token_ids, g.logprobs) for g in gens] for gens in first]}
    res["turn2"] = _outputs(engine, _second_turn(first))
    engine.sleep(release_weights=True)
    new = {n: t * 0.5 if "mlp" in n or "q_proj" in n else t for n, t in sd.items()}
    with engine.publication(1):
        engine.update_weights({**new, "lm_head.weight": sd["lm_head.weight"] * HEAD_SCALE}.items())
    res["published"] = _outputs(engine, _requests())
    return res


def test_two_ranks_generate_what_one_process_generates(tmp_path):
    """build_fast_engine(tensor_parallel=2) forks rank 1 (tp_launch.py) and drives it from here."""
    paths = [
        make_tiny_checkpoint(tmp_path / "kv2", tie_word_embeddings=False, seed=1),  # a KV head per rank
        make_tiny_checkpoint(tmp_path / "kv1", tie_word_embeddings=False, num_kv_heads=1, seed=2),  # shared
    ]
    for path in paths:
        kw: dict[str, Any] = {"model_path": path, "dtype": "fp32", "device": "cpu", "page_size": 8}
        kw |= {"max_model_len": 96, "max_batch_size": 8}
        engine = build_fast_engine(**kw, tensor_parallel=2)
        assert isinstance(engine, TPEngine) and engine.runner.spec.num_heads == 2  # of the model's 4
        try:
            tp2 = _scenario(engine, str(path))
        finally:
            engine.shutdown()
        assert [c.exitcode for c in engine.children] == [0]
        tp1 = _scenario(build_fast_engine(**kw), str(path))
        for phase in ("first", "turn2", "published"):
            assert [[t for t, _ in gens] for gens in tp2[phase]] == [
                [t for t, _ in gens] for gens in tp1[phase]
            ]
            lp1 = torch.tensor([x for gens in tp1[phase] for _, lps in gens for x in lps])
            lp2 = torch.tensor([x for gens in tp2[phase] for _, lps in gens for x in lps])
            assert torch.allclose(lp1, lp2, atol=1e-4), (phase, (lp1 - lp2).abs().max())
        assert tp1["published"] != tp1["first"]  # the publication changed what is generated
