"""The fast engine on tiny Qwen2.5-VL and Qwen3-VL models: image prompts sample as the reference engine samples
them and score as the trainer scores them (fp32 on the CPU: to 1e-5, the text bound), the vision tower runs
once per distinct image of a prefill (a group's n samples and requests showing the same image share it), and a
session's next turn reuses the K/V of the images shown before, encoding only the image it adds."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from ascent.messages import GenerationRequest, SamplingParams, TrainSample
from ascent.models.tiny_vl import make_tiny_vl_checkpoint
from ascent.models.vision import load_image_codec
from ascent.rollout import build_engine
from ascent.rollout.fast import build_fast_engine
from ascent.trainer import PolicyWorker
from tests.unit.vl_support import VL_FAMILIES, image_prompt

BOUND = 1e-5  # as for text prompts (test_fast_logprobs_vs_trainer.py)


@pytest.fixture(scope="module", params=VL_FAMILIES)
def vl(request, tmp_path_factory):
    """(reference engine, fast engine, trainer, codec, tokenizer, tower calls: a list the tower's forward
    appends its image count to)."""
    path = make_tiny_vl_checkpoint(tmp_path_factory.mktemp(request.param), family=request.param, seed=3)
    ref = build_engine("reference", model_path=path, device="cpu")
    fast = build_fast_engine(model_path=path, dtype="fp32", device="cpu", page_size=16, max_model_len=512)
    assert fast.vision is not None
    calls: list[int] = []
    fast.vision.module.register_forward_hook(
        lambda m, args, kw, out: calls.append(len(kw["grid_thw"])), with_kwargs=True
    )
    trainer = PolicyWorker(path, device="cpu", seed=0)
    return ref, fast, trainer, load_image_codec(path), AutoTokenizer.from_pretrained(path), calls


def _check_against(ref, trainer, reqs, fast_out) -> None:
    """fast_out equals the reference engine's tokens (same seeds) and logprobs, and the trainer's logprobs."""
    ref_out = ref.generate(reqs)
    samples = []
    for r, fast_gens, ref_gens in zip(reqs, fast_out, ref_out, strict=True):
        for f, g in zip(fast_gens, ref_gens, strict=True):
            assert f.token_ids == g.token_ids
            torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(g.logprobs), atol=BOUND, rtol=0)
            n = len(f.token_ids)
            samples.append(TrainSample(r.prompt_ids, f.token_ids, [1] * n, [0.0] * n, images=r.images))
    scored = trainer.compute_logprobs(samples, temperature=1.0, which="policy")
    fast_lps = [lp for gens in fast_out for g in gens for lp in g.logprobs]
    diffs = [abs(a - b) for a, b in zip(fast_lps, [x for s in scored for x in s], strict=True)]
    assert diffs and max(diffs) < BOUND, max(diffs)


def test_image_groups_sample_like_the_reference_and_score_like_the_trainer(vl):
    ref, fast, trainer, codec, tok, calls = vl
    prompts = [image_prompt(codec, tok, k, seed=s) for k, s in ((1, 1), (0, 0), (2, 2), (1, 1))]
    params = SamplingParams(temperature=1.0, max_new_tokens=8, n=3, seed=7)
    reqs = [GenerationRequest(ids, params, request_id=i, images=ims) for i, (ids, ims) in enumerate(prompts)]
    greedy = GenerationRequest(
        prompts[2][0], SamplingParams(temperature=0.0, max_new_tokens=8), images=prompts[2][1]
    )
    reqs.append(greedy)
    calls.clear()
    out = fast.generate(reqs)
    # 1 + 2 distinct images (the 4th request shows the 1st's, the greedy one the 3rd's), one tower pass
    assert calls == [3] and fast.stats["prefills"] == 1
    tokens = {t for gens in out for g in gens for t in g.token_ids}
    assert len(tokens) > 5 and codec.image_token_id not in tokens
    assert sum(len(g.token_ids) for gens in out for g in gens) > 80
    _check_against(ref, trainer, reqs, out)


def test_a_sessions_next_turn_reuses_the_image_kv_and_encodes_only_its_new_image(vl):
    ref, fast, trainer, codec, tok, calls = vl
    ids1, ims1 = image_prompt(codec, tok, 1, seed=4)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)
    turn1 = GenerationRequest(ids1, params, session_id="s", images=ims1)
    calls.clear()
    (gen1,) = fast.generate([turn1])[0]
    more, ims_more = image_prompt(codec, tok, 1, seed=5)  # the next user turn shows another image
    turn2 = GenerationRequest(ids1 + gen1.token_ids + more, params, session_id="s", images=ims1 + ims_more)
    reused = fast.stats["reused_tokens"]
    out2 = fast.generate([turn2])
    assert calls == [1, 1]  # turn 1's image, then only turn 2's new one
    assert out2[0][0].cached_tokens == len(ids1) + len(gen1.token_ids) - 1  # all but the last cached token
    assert fast.stats["reused_tokens"] - reused == out2[0][0].cached_tokens
    _check_against(ref, trainer, [turn2], out2)

    # the same tokens with another image of the same size where turn 1's was: its K/V are not reused
    other = image_prompt(codec, tok, 1, seed=4 + 3)[1]  # seed 7: same size as seed 4, other pixels
    assert other[0].grid_thw == ims1[0].grid_thw and other[0].digest != ims1[0].digest
    (g2,) = out2[0]
    ids3 = turn2.prompt_ids + g2.token_ids + tok.encode("ok")
    turn3 = GenerationRequest(ids3, params, session_id="s", images=other + ims_more)
    out3 = fast.generate([turn3])
    assert out3[0][0].cached_tokens == ids1.index(codec.image_token_id)  # up to the changed image
    _check_against(ref, trainer, [turn3], out3)


def test_images_need_a_vision_model_and_one_run_per_image(vl, fast_tiny_path):
    _, fast, _, codec, tok, _ = vl
    ids, images = image_prompt(codec, tok, 2, seed=2)
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match=r"image-token runs of lengths \[\d+, \d+\], its images need"):
        fast.generate([GenerationRequest(ids, params, images=images[:1])])
    text = build_fast_engine(model_path=fast_tiny_path, dtype="fp32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="vision-language checkpoint"):
        text.generate([GenerationRequest([3, 4, 5], params, images=images[:1])])


def test_published_weights_reach_the_decoder_and_the_tower(vl):
    """The trainer's names (`model.language_model.*`, `model.visual.*`) land in the engine's weights: after
    an update of every weight, image prompts still score as the trainer scores them. (Runs last: it changes
    the module's models.)"""
    ref, fast, trainer, codec, tok, _ = vl
    torch.manual_seed(0)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fast.update_weights(trainer.named_weights())
    ref.update_weights(trainer.named_weights())
    ids, images = image_prompt(codec, tok, 2, seed=1)
    req = GenerationRequest(
        ids, SamplingParams(temperature=1.0, max_new_tokens=6, n=2, seed=3), images=images
    )
    _check_against(ref, trainer, [req], fast.generate([req]))


def test_a_vlas_turns_sample_action_tokens_and_prefill_only_each_new_frame(vl):
    """A VLA episode on the fast engine: each turn samples only the action tokens (as the reference engine
    and the trainer see them), and each turn after the first prefills only its action's last token and the
    new frame (the tower encodes that frame alone)."""
    ref, fast, trainer, codec, tok, calls = vl
    actions = (30, 31, 32, 33)
    params = SamplingParams(temperature=1.0, max_new_tokens=2, seed=3, allowed_token_ids=actions)
    ids, images = image_prompt(codec, tok, 1, seed=4)
    frame: list[int] = []
    calls.clear()
    for turn in range(3):
        prefilled = fast.stats["prefill_tokens"]
        req = GenerationRequest(ids, params, session_id="episode", images=images)
        out = fast.generate([req])
        (gen,) = out[0]
        assert set(gen.token_ids) <= set(actions) and len(gen.token_ids) == 2 and gen.finish_reason == "stop"
        assert gen.cached_tokens == (0 if turn == 0 else len(ids) - len(frame) - 1)
        assert fast.stats["prefill_tokens"] - prefilled == len(ids) - gen.cached_tokens
        _check_against(ref, trainer, [req], out)
        frame, frame_images = image_prompt(codec, tok, 1, seed=5 + turn)  # the next observation
        ids, images = ids + gen.token_ids + frame, images + frame_images
    assert calls == [1, 1, 1]  # one new frame through the tower per turn
