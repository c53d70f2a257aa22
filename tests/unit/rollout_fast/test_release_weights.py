"""The fast engine's `sleep(release_weights=True)` on CPU: storages shrink to 0 bytes, a full `update_weights`
brings the same outputs back, a partial one leaves `wake`/`generate` refusing to run, the default keeps
the weights, and shared weights (a trainer's module) are never freed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ascent.messages import Generation, GenerationRequest, SamplingParams
from ascent.models import make_tiny_checkpoint
from ascent.rollout import ReferenceEngine
from ascent.rollout.fast import FastEngine, build_fast_engine
from ascent.rollout.fast.weights import load_state_dict

HEAD_SCALE = 10.0  # random init is near-uniform; a sharper head gives varied, peaked outputs
PROMPTS = [[2, 5, 6, 7, 8, 9, 10], [3, 4], [40, 41, 42, 43, 44]]
PARAMS = [
    SamplingParams(temperature=0.0, max_new_tokens=8),
    SamplingParams(temperature=1.0, max_new_tokens=8, n=2, seed=7),
]


@pytest.fixture(scope="module")
def untied_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("release_untied"), tie_word_embeddings=False, seed=1)


@pytest.fixture(scope="module")
def tied_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("release_tied"), tie_word_embeddings=True, seed=2)


def _full_weights(path: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors by HF name, with the sharpened head of an untied model."""
    sd = load_state_dict(str(path))
    if "lm_head.weight" in sd:
        sd["lm_head.weight"] = sd["lm_head.weight"] * HEAD_SCALE
    return sd


def _engine(path: Path) -> FastEngine:
    engine = build_fast_engine(model_path=path, dtype="fp32", device="cpu", page_size=16, max_model_len=64)
    engine.update_weights(_full_weights(path).items())
    return engine


def _run(engine: FastEngine | ReferenceEngine) -> list[list[tuple[list[int], str]]]:
    reqs = [
        GenerationRequest(list(p), params, request_id=i) for i, p in enumerate(PROMPTS) for params in PARAMS
    ]
    out: list[list[Generation]] = engine.generate(reqs)
    return [[(g.token_ids, g.finish_reason) for g in r] for r in out]


def _storage_sizes(engine: FastEngine) -> list[int]:
    return [t.untyped_storage().nbytes() for t in engine.weights.targets.values()]


def test_release_frees_every_storage_and_a_full_update_restores_outputs(untied_path: Path) -> None:
    engine, sd = _engine(untied_path), _full_weights(untied_path)
    before = _run(engine)
    assert engine.memory() == {"weights": sum(t.nbytes for t in sd.values()), "kv_cache": engine.cache.nbytes}
    engine.sleep(release_weights=True)
    assert set(_storage_sizes(engine)) == {0}
    assert engine.memory() == {"weights": 0, "kv_cache": 0}
    assert engine.weights.layers[0].qkv_w[0].shape[0] == sum(
        sd[f"model.layers.0.self_attn.{x}_proj.weight"].shape[0] for x in "qkv"
    )
    names = list(sd)
    engine.update_weights((n, sd[n]) for n in names[: len(names) // 2])  # buckets: two calls
    engine.update_weights((n, sd[n]) for n in names[len(names) // 2 :])
    engine.wake()
    assert engine.memory()["weights"] == sum(t.nbytes for t in sd.values())
    assert _run(engine) == before


def test_partial_update_after_release_refuses_to_run(untied_path: Path) -> None:
    engine, sd = _engine(untied_path), _full_weights(untied_path)
    before = _run(engine)
    engine.sleep(release_weights=True)
    k_name = "model.layers.1.self_attn.k_proj.weight"  # one slice of a fused q/k/v matrix
    engine.update_weights((n, t) for n, t in sd.items() if n != k_name)
    with pytest.raises(RuntimeError, match=r"1 of them were not sent.*k_proj.*publish a full set"):
        engine.wake()
    with pytest.raises(RuntimeError, match="or sleep without release_weights"):
        _run(engine)
    engine.update_weights([(k_name, sd[k_name])])
    assert _run(engine) == before


def test_release_twice_and_update_nothing_names_all_missing(untied_path: Path) -> None:
    engine = _engine(untied_path)
    engine.sleep(release_weights=True)
    engine.sleep(release_weights=True)  # asleep already: still fine
    missing = engine.weights.missing()
    assert len(missing) == len(engine.weights.targets)  # untied: every name is its own region
    with pytest.raises(RuntimeError, match=f"{len(missing)} of them"):
        engine.generate([GenerationRequest([2, 3], PARAMS[0])])


def test_tied_head_is_one_region(tied_path: Path) -> None:
    engine, sd = _engine(tied_path), _full_weights(tied_path)
    assert "lm_head.weight" not in sd  # the trainer publishes tied weights once, as the embedding
    assert engine.weights.lm_head is engine.weights.embed
    before = _run(engine)
    engine.sleep(release_weights=True)
    assert engine.weights.embed.untyped_storage().nbytes() == 0
    engine.update_weights(sd.items())
    assert _run(engine) == before


def test_default_sleep_keeps_weights(untied_path: Path) -> None:
    engine = _engine(untied_path)
    before, sizes = _run(engine), _storage_sizes(engine)
    engine.sleep()
    assert engine.memory()["kv_cache"] == 0 and _storage_sizes(engine) == sizes
    engine.wake()
    assert _run(engine) == before


def test_shared_weights_are_never_released(untied_path: Path) -> None:
    ref = ReferenceEngine.from_pretrained(untied_path, "fp32", "cpu")
    fast = build_fast_engine(model=ref.model, dtype="fp32", device="cpu", eos_token_ids=[1], max_model_len=64)
    assert fast.weights.shared and fast.memory()["weights"] == 0  # the trainer's memory, not the engine's
    before = _run(fast)
    fast.sleep(release_weights=True)
    assert all(p.untyped_storage().nbytes() > 0 for p in ref.model.parameters())
    fast.wake()
    assert _run(fast) == before


def test_reference_engine_accepts_release_weights(untied_path: Path) -> None:
    ref = ReferenceEngine.from_pretrained(untied_path, "fp32", "cpu", eos_token_ids=[1], pad_token_id=0)
    before = _run(ref)
    ref.sleep(release_weights=True)
    ref.wake()
    assert _run(ref) == before


def test_half_precision_keeps_an_fp32_embedding_and_refreshes_the_tied_head_copy(tied_path: Path) -> None:
    """bf16 owned weights: the embedding (residual stream source) and norm scales stay fp32 like the trainer's
    master weights; the tied head is a bf16 copy that every update of the embedding refreshes, and release
    frees the copy too."""
    from transformers import AutoConfig

    from ascent.rollout.fast.spec import spec_from_config
    from ascent.rollout.fast.weights import build_weights

    sd, spec = load_state_dict(str(tied_path)), spec_from_config(AutoConfig.from_pretrained(tied_path))
    w = build_weights(sd, spec, torch.bfloat16, torch.device("cpu"), share=False)
    assert w.embed.dtype == torch.float32 and w.norm.dtype == torch.float32
    assert w.lm_head.dtype == torch.bfloat16 and w.head_copy
    assert w.layers[0].o_w.dtype == torch.bfloat16
    new_embed = torch.randn_like(sd["model.embed_tokens.weight"])
    w.update([("model.embed_tokens.weight", new_embed)])
    assert torch.equal(w.embed, new_embed.float()) and torch.equal(w.lm_head, new_embed.to(torch.bfloat16))
    nbytes = w.nbytes
    assert w.release() == nbytes and w.nbytes == 0
    assert w.lm_head.untyped_storage().nbytes() == 0
