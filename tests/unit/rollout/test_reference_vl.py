"""The reference engine on tiny Qwen2.5-VL and Qwen3-VL models: image prompts batch with text prompts and
with each other (different image counts and sizes, left padding) as if each ran alone, and its logprobs are
those of a teacher-forced forward where the model computes its own multimodal positions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from ascent.messages import GenerationRequest, SamplingParams
from ascent.models.multimodal import vision_inputs
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from ascent.models.vision import load_image_codec
from ascent.rollout import ReferenceEngine, build_engine
from tests.unit.vl_support import VL_FAMILIES, image_prompt

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module", params=VL_FAMILIES)
def vl_setup(request, tmp_path_factory):
    path: Path = make_tiny_vl_checkpoint(tmp_path_factory.mktemp(request.param), family=request.param, seed=3)
    engine = build_engine("reference", model_path=path, device="cpu")
    assert isinstance(engine, ReferenceEngine)
    codec, tokenizer = load_image_codec(path), AutoTokenizer.from_pretrained(path)
    prompts = [image_prompt(codec, tokenizer, k, seed=k) for k in (1, 0, 2, 1)]
    return engine, prompts


def _requests(prompts, params):
    return [GenerationRequest(ids, params, request_id=i, images=ims) for i, (ids, ims) in enumerate(prompts)]


def test_image_requests_batched_equal_one_at_a_time(vl_setup):
    engine, prompts = vl_setup
    batched = engine.generate(_requests(prompts, GREEDY))
    for (ids, images), out in zip(prompts, batched, strict=True):
        alone = engine.generate([GenerationRequest(ids, GREEDY, images=images)])[0][0]
        assert out[0].token_ids == alone.token_ids
        torch.testing.assert_close(out[0].logprobs, alone.logprobs, atol=1e-5, rtol=0)


def test_logprobs_are_the_models_own_forward_with_its_images(vl_setup):
    engine, prompts = vl_setup
    params = SamplingParams(temperature=1.0, max_new_tokens=6, n=2, seed=5)
    outs = engine.generate(_requests(prompts, params))
    model = engine.model
    for (ids, images), gens in zip(prompts, outs, strict=True):
        for gen in gens:
            assert engine.model.config.image_token_id not in gen.token_ids  # never sampled
            x = torch.tensor([ids + gen.token_ids])
            with torch.no_grad():  # no position_ids: the model's own get_rope_index
                logits = model(input_ids=x, **vision_inputs(model, x, images, x.device)).logits[0]
            logp = torch.log_softmax(logits.float(), -1)[len(ids) - 1 : -1]
            want = logp.gather(-1, torch.tensor(gen.token_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(gen.logprobs), want, atol=1e-4, rtol=0)


def test_images_a_prompt_does_not_hold_are_refused(vl_setup):
    engine, prompts = vl_setup
    ids, images = prompts[2]
    with pytest.raises(ValueError, match="image-token runs of lengths"):
        engine.generate([GenerationRequest(ids, GREEDY, images=images[:1])])
