"""CriticWorker: value alignment, micro-batch invariance, learning, clipped loss, save/load, from_spec."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trainer_helpers import make_samples

from ascent.algorithms.value import value_loss
from ascent.trainer import CriticWorker, OptimSettings, minibatch_totals, pack
from ascent.trainer.critic import CRITIC_DIR, explained_variance, explained_variance_sums
from ascent.trainer.settings import CriticSpec

SPLITS = {
    "one": [list(range(8))],
    "eight": [[i] for i in range(8)],
    "three_five": [[0, 1, 2], [3, 4, 5, 6, 7]],
}


def _worker(path, lr=1e-3, value_clip=0.2, head_std=0.1, eps=1e-8, **kw):
    optim = OptimSettings(lr=lr, eps=eps)
    worker = CriticWorker(path, device="cpu", optim=optim, value_clip=value_clip, seed=0, **kw)
    if head_std:  # a non-zero head, so the backbone gets gradients from the first step
        torch.nn.init.normal_(worker.value_model.value_head.weight, std=head_std)
    return worker


def _totals(samples):
    return dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))


def _with_targets(worker, samples, old_shift=0.3, returns=None):
    """Set old_values near the current values (some tokens clip) and returns (a fixed target per sample)."""
    return [
        replace(
            s,
            old_values=[x + old_shift * ((j % 3) - 1) for j, x in enumerate(v)],
            returns=[(1.0 if i % 2 else -1.0) if returns is None else returns] * len(v),
        )
        for i, (s, v) in enumerate(zip(samples, worker.compute_values(samples), strict=True))
    ]


def _unpacked_values(worker, sample):
    """Reference: one unpadded sequence through the backbone, head on the rows P-1 .. P+R-2."""
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    hidden = worker.value_model.backbone(input_ids=ids, use_cache=False).last_hidden_state[0]
    p, r = len(sample.prompt_ids), len(sample.response_ids)
    return worker.value_model.value_head(hidden[p - 1 : p - 1 + r]).squeeze(-1)


def test_values_align_with_response_tokens(tiny_path):
    worker = _worker(tiny_path, max_tokens_per_micro_batch=24)
    samples = make_samples(8, seed=2)
    got = worker.compute_values(samples)
    assert [len(v) for v in got] == [len(s.response_ids) for s in samples]
    with torch.no_grad():
        for s, v in zip(samples, got, strict=True):
            torch.testing.assert_close(torch.tensor(v), _unpacked_values(worker, s), atol=1e-5, rtol=0)
    # value[t] is read where token t is predicted: it sees the prompt and response[:t], never token t itself
    s = samples[0]
    changed_last = make_samples(8, seed=2)[0]
    changed_last.response_ids[-1] = (changed_last.response_ids[-1] + 1) % 60 + 4
    changed_prompt = make_samples(8, seed=2)[0]
    changed_prompt.prompt_ids[-1] = (changed_prompt.prompt_ids[-1] + 1) % 60 + 4
    # one forward each, of the same shape: bitwise equality then says the last token is not read at all (in
    # one packed batch the two would sit at other rows and offsets, where kernels may round differently)
    base, last, prompt = (worker.compute_values([x])[0] for x in (s, changed_last, changed_prompt))
    assert last == base
    assert all(a != b for a, b in zip(prompt, base, strict=True))


def test_zero_head_starts_at_zero(tiny_path):
    worker = _worker(tiny_path, head_std=0.0)
    assert all(x == 0.0 for v in worker.compute_values(make_samples(3)) for x in v)


def test_gradient_is_invariant_to_micro_batch_split(tiny_path):
    grads, weights = {}, {}
    for name, split in SPLITS.items():
        # Adam's first step is lr * g / (|g| + eps): eps = 1e-4 keeps float-summation noise on tiny gradient
        # entries from flipping g / |g| (as in the policy's invariance test).
        worker = _worker(tiny_path, lr=1e-2, eps=1e-4)
        initial = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
        samples = _with_targets(worker, make_samples(8, seed=11))
        worker.model.train()
        metrics = worker.accumulate(samples, split, **_totals(samples))
        grads[name] = {n: p.grad.clone() for n, p in worker.model.named_parameters()}
        worker._optimizer_step()
        weights[name] = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
        assert 0 < metrics.result()["critic/clipfrac"] < 1
    backbone_grad = grads["one"]["backbone.layers.0.self_attn.q_proj.weight"]
    assert backbone_grad.abs().max() > 0
    for name in ("eight", "three_five"):
        for p, g in grads["one"].items():
            # gradients of order 1 here: the splits' sums differ by a few ulps (4.8e-7 at 1.09), so relative
            # to the entry; the weights as in the policy's test (Adam's first step scales a difference by up to
            # lr / eps = 100). A mis-weighted micro-batch is off by percents, a wrong step by ~lr.
            torch.testing.assert_close(grads[name][p], g, atol=1e-6, rtol=1e-5, msg=f"{name} {p}")
            torch.testing.assert_close(weights[name][p], weights["one"][p], atol=1e-5, rtol=0)
    assert max((weights["one"][n] - initial[n]).abs().max().item() for n in initial) > 1e-3


def test_updates_on_fixed_returns_reduce_the_loss(tiny_path):
    worker = _worker(tiny_path, lr=1e-3, value_clip=None)
    samples = _with_targets(worker, make_samples(8, seed=5))
    history = [worker.update(samples, **_totals(samples)) for _ in range(5)]
    first, last = history[0], history[-1]
    for key in ("critic/loss", "critic/value_mean", "critic/clipfrac", "critic/grad_norm"):
        assert torch.isfinite(torch.tensor(first[key])), key
    assert first["critic/clipfrac"] == 0.0 and first["critic/skipped"] == 0.0
    assert last["critic/loss"] < 0.2 * first["critic/loss"]
    assert first["critic/explained_variance"] < 0 < 0.5 < last["critic/explained_variance"]
    assert worker.step == 5 and all(p.grad is None for p in worker.model.parameters())


def test_clipped_value_loss(tiny_path):
    """v - old = 1 > clip 0.2 and R = v + 1: the clipped branch wins, its gradient is 0, the loss is 1.62."""
    for clip, want_loss, want_clipfrac in ((0.2, 0.5 * 1.8**2, 1.0), (None, 0.5, 0.0)):
        worker = _worker(tiny_path, max_tokens_per_micro_batch=40, value_clip=clip)
        samples = make_samples(6, seed=3)
        samples = [
            replace(s, old_values=[x - 1.0 for x in v], returns=[x + 1.0 for x in v])
            for s, v in zip(samples, worker.compute_values(samples), strict=True)
        ]
        before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
        m = worker.update(samples, **_totals(samples))
        assert m["critic/loss"] == pytest.approx(want_loss, rel=1e-4)
        assert m["critic/clipfrac"] == pytest.approx(want_clipfrac)
        unchanged = all(torch.equal(before[n], p) for n, p in worker.model.named_parameters())
        assert (m["critic/grad_norm"] == 0.0 and unchanged) if clip else (m["critic/grad_norm"] > 0)


def test_masked_tokens_are_left_out_of_the_loss(tiny_path):
    worker = _worker(tiny_path)
    samples = _with_targets(worker, make_samples(4, seed=9))
    samples = [replace(s, loss_mask=[1] + [0] * (len(s.response_ids) - 1)) for s in samples]
    values = worker.compute_values(samples)
    want = sum(
        float(
            value_loss(torch.tensor(v[:1]), torch.tensor(s.old_values[:1]), torch.tensor(s.returns[:1]), 0.2)
        )
        for s, v in zip(samples, values, strict=True)
    ) / len(samples)
    assert worker.update(samples, **_totals(samples))["critic/loss"] == pytest.approx(want, rel=1e-5)


def test_update_needs_returns(tiny_path):
    worker = _worker(tiny_path)
    samples = make_samples(2)
    with pytest.raises(ValueError, match="returns"):
        worker.update(samples, **_totals(samples))


def test_save_load_round_trip(tiny_path, tmp_path):
    worker = _worker(tiny_path, lr=1e-2)
    samples = _with_targets(worker, make_samples(6, seed=4))
    worker.update(samples, **_totals(samples))
    worker.save(tmp_path)
    assert {"model.safetensors", "config.json", "trainer_state.pt"} <= {
        p.name for p in (tmp_path / CRITIC_DIR).iterdir()
    }
    fresh = _worker(tiny_path, lr=1e-2, head_std=0.0)
    fresh.load(tmp_path)
    assert fresh.step == 1 and fresh.compute_values(samples) == worker.compute_values(samples)
    # optimizer and schedule restored too: the next step is identical
    worker.update(samples, **_totals(samples))
    fresh.update(samples, **_totals(samples))
    assert fresh.compute_values(samples) == worker.compute_values(samples)
    with pytest.raises(FileNotFoundError, match="no critic"):
        fresh.load(tmp_path / "elsewhere")


def test_from_spec_reads_critic_settings(tiny_path):
    optim = OptimSettings(lr=2e-5, max_grad_norm=0.7, total_steps=10)
    spec = CriticSpec(
        str(tiny_path), device="cpu", optim=optim, value_clip=0.5, max_tokens_per_micro_batch=123
    )
    worker = CriticWorker.from_spec(spec)
    assert worker.value_clip == 0.5 and worker.max_tokens == 123
    assert worker.optim_settings.max_grad_norm == 0.7 and worker.optim_settings.total_steps == 10
    assert worker.scheduler.get_last_lr()[0] == pytest.approx(2e-5)


def test_explained_variance_sums_combine():
    r, v = torch.tensor([1.0, -1.0, 2.0, 0.5]), torch.tensor([0.8, -0.5, 1.0, 0.5])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    whole = explained_variance(explained_variance_sums(v, r, mask))
    parts = explained_variance_sums(v[:2], r[:2], mask[:2]) + explained_variance_sums(v[2:], r[2:], mask[2:])
    rm, vm = r[:3].double(), v[:3].double()
    want = 1 - (rm - vm).var(unbiased=False) / rm.var(unbiased=False)
    assert whole == pytest.approx(float(want)) and explained_variance(parts) == pytest.approx(whole)


def test_pack_carries_critic_targets():
    samples = make_samples(3, seed=1)
    assert pack(samples).returns is None and pack(samples).old_values is None
    samples = [
        replace(s, returns=[float(i)] * len(s.response_ids), old_values=[-float(i)] * len(s.response_ids))
        for i, s in enumerate(samples)
    ]
    packed = pack(samples)
    assert packed.split(packed.returns) == [s.returns for s in samples]
    assert packed.split(packed.old_values) == [s.old_values for s in samples]
    samples[1] = replace(samples[1], returns=samples[1].returns[:-1])
    with pytest.raises(ValueError, match="returns has"):
        pack(samples)


def test_bf16_autocast_keeps_fp32_masters_and_values(tiny_path):
    worker = _worker(tiny_path, dtype="bf16")
    assert all(p.dtype == torch.float32 for p in worker.model.parameters())
    samples = _with_targets(worker, make_samples(4, seed=6))
    m = worker.update(samples, **_totals(samples))
    assert torch.isfinite(torch.tensor(m["critic/loss"])) and m["critic/grad_norm"] > 0
