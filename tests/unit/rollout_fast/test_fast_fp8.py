"""FP8 rollout (fp8.py): quantisation error bounds, the FP8 engine's logprobs (its own FP8 forward's, a
bounded gap from the full-precision model's), quantisation on receipt of a publication, and the refusals."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from ascent.messages import GenerationRequest, SamplingParams
from ascent.rollout.fast import build_fast_engine
from ascent.rollout.fast.fp8 import (
    FP8,
    Fp8Error,
    Fp8Weight,
    check_fp8_device,
    dequantize,
    fp8_linear,
    quantize_rows,
    quantize_weights,
)
from ascent.rollout.fast.weights import LayerWeights, ModelWeights

# e4m3 keeps 3 mantissa bits: a normal value rounds to within 2^-4 of itself; below the smallest normal
# (2^-6 of the scale's unit) the absolute error is at most half the subnormal step, 2^-10 units.
REL, SUBNORMAL = 2.0**-4, 2.0**-10


def test_round_trip_error_is_bounded_per_row_and_rows_do_not_share_scales():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=g) * torch.logspace(-3, 3, 64)[:, None]  # rows 6 decades apart
    w[5] = 0.0  # a zero row (padding) quantises to zeros with a finite scale
    q, scale = quantize_rows(w)
    assert q.dtype == FP8 and scale.shape == (64,) and torch.isfinite(scale).all()
    back = dequantize(q, scale)
    err = (back - w).abs()
    assert (err <= REL * w.abs() + SUBNORMAL * scale[:, None] * 1.0001).all()
    assert torch.equal(back[5], torch.zeros(96))
    assert torch.allclose(back.abs().amax(1), w.abs().amax(1), rtol=1e-6)  # each row's max is exact
    w2 = w.clone()
    w2[0] *= 1000  # one row's magnitude moves nothing else
    q2, scale2 = quantize_rows(w2)
    assert torch.equal(q2[1:].view(torch.uint8), q[1:].view(torch.uint8)) and torch.equal(
        scale2[1:], scale[1:]
    )


def test_fp8_matmul_is_the_dequantised_operands_product_and_near_the_exact_one():
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(7, 48, generator=g), torch.randn(32, 48, generator=g), torch.randn(32, generator=g)
    fw = Fp8Weight(*quantize_rows(w), torch.float32)
    out = fp8_linear(x, fw, b)
    xq, sx = quantize_rows(x)  # activations: per token
    assert torch.allclose(out, dequantize(xq, sx) @ dequantize(fw.q, fw.scale).T + b, atol=1e-5)
    exact = x @ w.T + b
    assert 1e-3 < (out - exact).norm() / exact.norm() < 2 * REL  # quantised, and within e4m3's rounding


def _fp8_hf(model: torch.nn.Module) -> torch.nn.Module:
    """An HF model whose decoder linears run `fp8_linear` on their own weights: the FP8 model, computed
    without the engine (q, k and v see the same per-token activation scales as the engine's fused matrix)."""
    for layer in model.model.layers:
        for lin in [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]:

            def forward(x, lin=lin):
                fw = Fp8Weight(*quantize_rows(lin.weight), x.dtype)
                return fp8_linear(x.reshape(-1, x.shape[-1]), fw, lin.bias).reshape(*x.shape[:-1], -1)

            lin.forward = forward
    return model


def _score(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = model(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
    return logp.gather(1, torch.tensor(tokens)[:, None])[:, 0]


def _gaps(engine, path, reqs, perturb=None) -> tuple[float, float]:
    """Max |engine - model| over the sampled tokens: (FP8 HF model, full-precision HF model)."""
    full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if perturb is not None:
        perturb(full)
    fp8 = _fp8_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
    fp8.load_state_dict(full.state_dict())
    same, gap = 0.0, 0.0
    for req, gens in zip(reqs, engine.generate(reqs), strict=True):
        for gen in gens:
            lp = torch.tensor(gen.logprobs)
            same = max(same, (lp - _score(fp8, req.prompt_ids, gen.token_ids)).abs().max().item())
            gap = max(gap, (lp - _score(full, req.prompt_ids, gen.token_ids)).abs().max().item())
    return same, gap


def test_fp8_engine_samples_and_scores_with_its_fp8_weights_also_after_a_publication(fast_tiny_path):
    engine = build_fast_engine(
        model_path=fast_tiny_path,
        dtype="fp32",
        device="cpu",
        page_size=16,
        max_model_len=64,
        quantization="fp8",
    )
    lw = engine.weights.layers[0]
    assert isinstance(lw.qkv_w[0], Fp8Weight) and isinstance(lw.down_w, Fp8Weight)
    assert engine.weights.lm_head.dtype == torch.float32  # head, embedding and norms stay unquantised
    reqs = [
        GenerationRequest([5, 6, 7, 8 + i], SamplingParams(max_new_tokens=10, n=2, seed=i)) for i in range(3)
    ]
    same, gap = _gaps(engine, fast_tiny_path, reqs)
    assert same < 1e-4 < 1e-3 < gap < 0.1, (same, gap)  # the FP8 model's logprobs, a bounded gap

    def perturb(model):  # a publication: every matrix moves, each row by its own factor
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + 0.5 * torch.rand(p.shape[0], *[1] * (p.dim() - 1), generator=g))
        engine.update_weights(model.state_dict().items())  # q/k/v one by one into the fused FP8 matrix

    same, gap = _gaps(engine, fast_tiny_path, reqs, perturb)
    assert same < 1e-4 < 1e-3 < gap < 0.1, (same, gap)


def test_refusals_name_the_setting_and_the_fix(fast_tiny_path, monkeypatch):
    with pytest.raises(Fp8Error, match="rollout.quantization='int4'"):
        build_fast_engine(model_path=fast_tiny_path, device="cpu", quantization="int4")
    engine = build_fast_engine(
        model_path=fast_tiny_path, dtype="fp32", device="cpu", max_model_len=64, quantization="fp8"
    )
    lora = [(f"model.layers.0.self_attn.q_proj.{p}", torch.zeros(2, 2)) for p in ("lora_A", "lora_B")]
    with pytest.raises(Fp8Error, match="model.lora.publish=merged"):
        engine.update_weights([*lora, ("model.layers.0.self_attn.q_proj.lora_scaling", torch.tensor(1.0))])

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(Fp8Error, match=r"NVIDIA A100 \(compute capability 8.0\).*rollout.quantization=none"):
        check_fp8_device(torch.device("cuda", 0))

    t = torch.zeros(4, 4)
    moe = LayerWeights(t[0], t[0], (t,), (None,), t, None, None, (t,), torch.zeros(2, 4, 4))
    weights = ModelWeights(t, t[0], t, [moe], {}, shared=False)
    with pytest.raises(Fp8Error, match="mixture-of-experts"):
        quantize_weights(weights, torch.device("cpu"))
    with pytest.raises(Fp8Error, match="shared with the trainer"):
        quantize_weights(ModelWeights(t, t[0], t, [moe], {}, shared=True), torch.device("cpu"))
