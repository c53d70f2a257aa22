"""ascent.models.varlen on CPU: a reference kernel stands in for flash varlen_attn (both torch API shapes)."""

from __future__ import annotations

import pytest
import torch

from ascent.models import varlen


def _reference_kernel(new_api: bool):
    """Per-sequence causal SDPA with the signature of torch 2.11 (is_causal) or >= 2.12 (window_size, gqa)."""

    def run(q, k, v, cu_q, cu_k, max_q, max_k, scale, gqa):
        if not gqa:
            assert k.shape[1] == q.shape[1], "2.11 API: K/V must be repeated by the caller"
        out = torch.empty_like(q)
        for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
            qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
            o = torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa
            )
            out[a:b] = o.transpose(0, 1)
        return out

    if new_api:

        def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
            assert window_size == (-1, 0)
            return run(q, k, v, cu_q, cu_k, max_q, max_k, scale, enable_gqa)

        return kernel

    def old_kernel(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
        assert is_causal
        return run(q, k, v, cu_q, cu_k, max_q, max_k, None, False)

    return old_kernel


def test_sequence_offsets_cached():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    cu, longest = varlen.sequence_offsets(pos)
    assert cu.tolist() == [0, 3, 5, 9] and cu.dtype == torch.int32 and longest == 4
    assert varlen.sequence_offsets(pos)[0] is cu


@pytest.mark.parametrize("new_api", [False, True])
def test_matches_sdpa_on_packed_rows(tmp_path, monkeypatch, new_api):
    from transformers import AutoModelForCausalLM

    from ascent.messages import TrainSample
    from ascent.models.tiny import make_tiny_checkpoint
    from ascent.trainer.logprobs import hidden_states
    from ascent.trainer.packing import pack

    path = make_tiny_checkpoint(tmp_path / "m", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(0)
    samples = [
        TrainSample(
            prompt_ids=torch.randint(3, 80, (p,), generator=g).tolist(),
            response_ids=torch.randint(3, 80, (r,), generator=g).tolist(),
            loss_mask=[1] * r,
            advantages=[0.0] * r,
        )
        for p, r in ((5, 7), (3, 2), (9, 11))
    ]
    packed = pack(samples)
    with torch.no_grad():
        want = hidden_states(model, packed)
    monkeypatch.setattr(varlen, "_kernel", lambda: _reference_kernel(new_api))
    monkeypatch.setattr(varlen, "available", lambda: True)
    monkeypatch.setattr(varlen, "_CALL", None)
    monkeypatch.setattr(varlen, "NATIVE_GQA", False)  # the 2.11 API's repeat path (native: its own test)
    assert varlen.enable_varlen_attention(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = hidden_states(model, pack(samples))
        packed = pack(samples)
        packed.cu_seqlens = None  # the other source of the boundaries: read off position_ids
        from_positions = hidden_states(model, packed)
    torch.testing.assert_close(from_positions, got, rtol=0, atol=0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model.set_attn_implementation("sdpa")
        ref_bf16 = hidden_states(model, pack(samples))
    err = (got.float() - ref_bf16.float()).norm() / ref_bf16.float().norm()
    assert err < 2e-2, err
    assert (got.float() - want).norm() / want.norm() < 5e-2


def _packed_tiny(tmp_path):
    from transformers import AutoModelForCausalLM

    from ascent.messages import TrainSample
    from ascent.models.tiny import make_tiny_checkpoint
    from ascent.trainer.packing import pack

    path = make_tiny_checkpoint(tmp_path / "m", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa").eval()
    samples = [
        TrainSample(prompt_ids=[5] * p, response_ids=[7] * r, loss_mask=[1] * r, advantages=[0.0] * r)
        for p, r in ((5, 7), (3, 2), (9, 11))
    ]
    return model, pack(samples)


def test_packer_offsets_reach_the_kernel_without_a_host_read(tmp_path, monkeypatch):
    """pack() knows the boundaries; they travel as keywords, equal what position_ids say, and the
    position_ids reader (a GPU sync on CUDA) is never called."""
    from ascent.trainer.logprobs import hidden_states

    model, packed = _packed_tiny(tmp_path)
    seen = []
    ref = _reference_kernel(False)

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
        seen.append((cu_q.tolist(), max_q))
        return ref(q, k, v, cu_q, cu_k, max_q, max_k, is_causal)

    monkeypatch.setattr(varlen, "_kernel", lambda: kernel)
    monkeypatch.setattr(varlen, "available", lambda: True)
    monkeypatch.setattr(varlen, "_CALL", None)
    monkeypatch.setattr(varlen, "NATIVE_GQA", False)
    assert varlen.enable_varlen_attention(model)
    want = varlen.sequence_offsets(packed.position_ids.clone())
    monkeypatch.setattr(varlen, "sequence_offsets", lambda pos: pytest.fail("read offsets on the host"))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden_states(model, packed)
    assert seen == [(want[0].tolist(), want[1])] * 2  # one call per layer
    assert packed.cu_seqlens.tolist() == [0, 12, 17, 37] and packed.max_seqlen == 20


def test_compiled_layer_traces_through_varlen_attention(tmp_path, monkeypatch):
    """With the packer's offsets, a compiled decoder layer is ONE graph (fullgraph=True raises on a break)."""
    from ascent.trainer.logprobs import hidden_states

    model, packed = _packed_tiny(tmp_path)
    ref = _reference_kernel(False)

    @torch.library.custom_op("ascent_test::varlen_ref", mutates_args=())
    def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int) -> torch.Tensor:
        return ref(q, k, v, cu, cu, max_len, max_len, True)

    op.register_fake(lambda q, k, v, cu, max_len: torch.empty_like(q))

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
        return op(q, k, v, cu_q, max_q)

    monkeypatch.setattr(varlen, "_kernel", lambda: kernel)
    monkeypatch.setattr(varlen, "available", lambda: True)
    monkeypatch.setattr(varlen, "_CALL", None)
    monkeypatch.setattr(varlen, "NATIVE_GQA", False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert varlen.enable_varlen_attention(model)
        eager = hidden_states(model, packed)
        torch._dynamo.reset()
        for layer in model.model.layers:
            layer.forward = torch.compile(layer.forward, backend="eager", fullgraph=True)
        compiled = hidden_states(model, packed)
    torch.testing.assert_close(compiled, eager)


def test_old_api_runs_grouped_heads_natively(tmp_path, monkeypatch):
    """torch 2.11's varlen_attn has no enable_gqa: grouped K/V go to flash's aten op with their own heads
    (no repeated copies), and the result equals the repeat path's."""
    from ascent.trainer.logprobs import hidden_states

    model, packed = _packed_tiny(tmp_path)
    ref = _reference_kernel(True)
    seen = []

    def native(q, k, v, cu, max_len, scale):
        seen.append((q.shape[1], k.shape[1], v.shape[1]))
        return ref(q, k, v, cu, cu, max_len, max_len, scale=scale, window_size=(-1, 0), enable_gqa=True)

    def old_kernel(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
        assert k.shape[1] == q.shape[1], "grouped heads reached the old kernel"
        return _reference_kernel(False)(q, k, v, cu_q, cu_k, max_q, max_k, is_causal)

    monkeypatch.setattr(varlen, "_kernel", lambda: old_kernel)
    monkeypatch.setattr(varlen, "available", lambda: True)
    monkeypatch.setattr(varlen, "_flash_gqa", native)
    outs = []
    for flag in (True, False):
        monkeypatch.setattr(varlen, "NATIVE_GQA", flag)
        monkeypatch.setattr(varlen, "_CALL", None)
        assert varlen.enable_varlen_attention(model)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(hidden_states(model, packed))
    assert seen == [(4, 2, 2)] * 2  # one call per layer, native path only
    torch.testing.assert_close(outs[0], outs[1])


def test_refuses_a_padding_mask():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="packed row"):
        varlen.varlen_attention(None, q, q, q, torch.ones(1, 1, 3, 3, dtype=torch.bool), position_ids=None)


def test_train_attention_setting_on_cpu(tmp_path):
    from transformers import AutoModelForCausalLM

    from ascent.models.tiny import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path / "m", hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2)
    tiny_model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa")
    cpu = torch.device("cpu")
    assert not varlen.enable_for_training(tiny_model, cpu, torch.bfloat16, "auto")  # falls back to SDPA
    assert not varlen.enable_for_training(tiny_model, cpu, torch.bfloat16, "sdpa")
    with pytest.raises(ValueError, match="train.attention=varlen needs CUDA"):
        varlen.enable_for_training(tiny_model, cpu, torch.bfloat16, "varlen")
    with pytest.raises(ValueError, match="train.attention='flash'"):
        varlen.enable_for_training(tiny_model, cpu, torch.bfloat16, "flash")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_vision_language_model_runs_its_language_model_varlen_and_its_tower_on_sdpa(
    tmp_path, monkeypatch, family
):
    """Packed image rows: the language model takes the packer's offsets (one kernel call per layer, the
    row's sequence boundaries), the vision tower keeps SDPA, and the hidden states match SDPA's."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from ascent.messages import TrainSample
    from ascent.models.multimodal import language_model, vision_tower
    from ascent.models.tiny_vl import make_tiny_vl_checkpoint
    from ascent.models.vision import load_image_codec
    from ascent.trainer.logprobs import hidden_states
    from ascent.trainer.packing import pack
    from tests.unit.vl_support import image_prompt

    path = make_tiny_vl_checkpoint(tmp_path / "vl", family=family, seed=1)
    model = AutoModelForImageTextToText.from_pretrained(str(path), attn_implementation="sdpa").eval()
    codec, tokenizer = load_image_codec(path), AutoTokenizer.from_pretrained(path)
    response = tokenizer.encode("abc")
    samples = []
    for i, k in enumerate((1, 0, 2, 1)):
        ids, images = image_prompt(codec, tokenizer, k, seed=i % 3)  # rows 0 and 3 share their image
        samples.append(TrainSample(ids, response, [1] * len(response), [0.0] * len(response), images=images))
    packed = pack(samples)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = hidden_states(model, packed)
    seen = []
    ref = _reference_kernel(False)

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
        seen.append(cu_q.tolist())
        return ref(q, k, v, cu_q, cu_k, max_q, max_k, is_causal)

    monkeypatch.setattr(varlen, "_kernel", lambda: kernel)
    monkeypatch.setattr(varlen, "available", lambda: True)
    monkeypatch.setattr(varlen, "_CALL", None)
    monkeypatch.setattr(varlen, "NATIVE_GQA", False)
    assert varlen.enable_varlen_attention(model)
    assert language_model(model).config._attn_implementation == varlen.NAME
    assert vision_tower(model).config._attn_implementation == "sdpa"
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = hidden_states(model, packed)
    layers = language_model(model).config.num_hidden_layers
    assert seen == [packed.cu_seqlens.tolist()] * layers
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 2e-2, err
