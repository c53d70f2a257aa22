"""A Qwen3-MoE under tensor parallelism (CPU, gloo): the router replicated, every expert split over the
ranks by its intermediate features. Two ranks generate what one process generates (greedy tokens equal,
fp32 logprobs within 1e-5) and record the same experts for routing replay, before and after a publication of
the trainer's stacked expert tensors (each rank receiving its slice). The two ranks run the routed experts
path (grouped over the chosen experts, each rank on its slice; the GPU default), the one process the dense
path, so this also shows the paths agree under tensor parallelism. The slicing itself (stacked and
per-expert names agree and put every expert back together) is checked without processes, and so is the
refusal of an expert width the ranks cannot split."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from ascent.config import ConfigError
from ascent.messages import GenerationRequest, SamplingParams
from ascent.models import load_model
from ascent.models.families import ModelSpec
from ascent.models.tiny import make_tiny_moe_checkpoint
from ascent.orchestrator import preflight
from ascent.rollout.fast import TPEngine, build_fast_engine
from ascent.rollout.fast.moe import experts_forward_routed
from ascent.rollout.fast.tp_shard import is_sharded, shard_spec, shard_tensor

E, H, INTER = 4, 8, 6
STACKED = "model.layers.0.mlp.experts."


def _moe_spec(inter: int = INTER) -> ModelSpec:
    dense = ModelSpec("qwen3_moe", 50, H, 256, 1, 4, 2, 2, 1e-6, 64, False)
    moe = {"num_experts": E, "experts_per_token": 2, "moe_intermediate_size": inter, "moe_layers": (0,)}
    return dataclasses.replace(dense, **moe)


def test_expert_slices_from_stacked_and_per_expert_names_agree_and_rebuild_every_expert():
    g = torch.Generator().manual_seed(0)
    gate, up = torch.randn(E, INTER, H, generator=g), torch.randn(E, INTER, H, generator=g)
    down = torch.randn(E, H, INTER, generator=g)
    spec, size = _moe_spec(), 2
    stacked_gu = [
        shard_tensor(STACKED + "gate_up_proj", torch.cat([gate, up], 1), spec, r, size) for r in (0, 1)
    ]
    stacked_d = [shard_tensor(STACKED + "down_proj", down, spec, r, size) for r in (0, 1)]
    for r in range(size):
        per_expert = [
            torch.cat(
                [
                    shard_tensor(f"{STACKED}{e}.{p}_proj.weight", w[e], spec, r, size)
                    for p, w in (("gate", gate), ("up", up))
                ]
            )
            for e in range(E)
        ]
        assert torch.equal(torch.stack(per_expert), stacked_gu[r])  # what load and publication hold agree
        d = [shard_tensor(f"{STACKED}{e}.down_proj.weight", down[e], spec, r, size) for e in range(E)]
        assert torch.equal(torch.stack(d), stacked_d[r])
    half = INTER // size
    assert torch.equal(torch.cat([s[:, :half] for s in stacked_gu], 1), gate)  # rank r: gate rows, then up
    assert torch.equal(torch.cat([s[:, half:] for s in stacked_gu], 1), up)
    assert torch.equal(torch.cat(stacked_d, 2), down)
    assert not is_sharded("model.layers.0.mlp.gate.weight")  # the router is every rank's
    local = shard_spec(spec, size)
    assert (local.moe_intermediate_size, local.num_experts, local.experts_per_token) == (3, E, 2)


def test_an_expert_width_the_ranks_cannot_split_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel=4: the model's moe_intermediate_size=6 "):
        shard_spec(_moe_spec(), 4)  # every layer routed: the unused dense width (256) is not asked about
    from transformers import Qwen3MoeConfig

    Qwen3MoeConfig(
        vocab_size=50,
        hidden_size=H,
        intermediate_size=32,
        moe_intermediate_size=6,
        num_experts=E,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=2,
    ).save_pretrained(tmp_path)
    model = SimpleNamespace(path=str(tmp_path), trust_remote_code=False)
    run = SimpleNamespace(model=model, rollout=SimpleNamespace(engine="fast", tensor_parallel=4))
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel=4: .*moe_intermediate_size=6") as err:
        preflight.check_tensor_parallel(run)  # `ascent train` stops before any worker starts
    assert err.value.exit_code == 2
    preflight.check_tensor_parallel(
        SimpleNamespace(model=model, rollout=SimpleNamespace(engine="fast", tensor_parallel=2))
    )


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory):
    return make_tiny_moe_checkpoint(tmp_path_factory.mktemp("moe_tp"), expert_scale=10.0, seed=2)


def _requests() -> list[GenerationRequest]:
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 2, 10), (25, 1, 8), (9, 1, 12)]  # (prompt, n, max_new)
    return [
        GenerationRequest(
            torch.randint(4, 80, (p,), generator=g).tolist(),
            SamplingParams(temperature=0.0, max_new_tokens=m, n=n),
        )
        for p, n, m in shapes
    ]


def _scenario(engine, trainer) -> dict:
    """Generation, then a publication of the trainer's (stacked) weights with changed routers and experts."""
    res = {"first": [g for gens in engine.generate(_requests()) for g in gens]}
    engine.update_weights(trainer.named_parameters())
    res["published"] = [g for gens in engine.generate(_requests()) for g in gens]
    return res


def test_two_ranks_run_a_mixture_of_experts_as_one_process(moe_path):
    trainer = load_model(moe_path, dtype="fp32", device="cpu")
    with torch.no_grad():
        for name, p in trainer.named_parameters():
            if ".mlp." in name:
                p.mul_(1.5)
    assert STACKED + "gate_up_proj" in dict(trainer.named_parameters())  # the trainer publishes them stacked
    kw = {"model_path": moe_path, "dtype": "fp32", "device": "cpu", "page_size": 8, "max_model_len": 64}
    engine = build_fast_engine(**kw, max_batch_size=8, tensor_parallel=2, moe_path="routed")
    assert isinstance(engine, TPEngine) and engine.runner.math.experts is experts_forward_routed
    assert engine.weights.layers[0].down_w.shape == (8, 64, 16)  # every expert: half its 32 features
    try:
        tp2 = _scenario(engine, trainer)
    finally:
        engine.shutdown()
    assert [c.exitcode for c in engine.children] == [0]
    tp1 = _scenario(build_fast_engine(**kw, max_batch_size=8, moe_path="dense"), trainer)
    for phase in ("first", "published"):
        for one, two in zip(tp1[phase], tp2[phase], strict=True):
            assert two.token_ids == one.token_ids
            torch.testing.assert_close(
                torch.tensor(two.logprobs), torch.tensor(one.logprobs), atol=1e-5, rtol=0
            )
            assert two.routed_experts.shape[1:] == (2, 2)  # [tokens, MoE layers, k]
            assert torch.equal(two.routed_experts, one.routed_experts)
    assert [g.token_ids for g in tp1["published"]] != [g.token_ids for g in tp1["first"]]
    assert not all(
        torch.equal(a.routed_experts, b.routed_experts)
        for a, b in zip(tp1["published"], tp1["first"], strict=True)
    )
