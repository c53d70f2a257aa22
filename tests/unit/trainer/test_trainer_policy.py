"""PolicyWorker: logprobs, micro-batch invariance of the update, KL reference, metrics, save/load, OOM
message."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trainer_helpers import make_samples, naive_logprobs

from ascent.trainer import LossSettings, OptimSettings, PolicyWorker, TrainerOutOfMemory, minibatch_totals
from ascent.trainer import policy as policy_mod
from ascent.trainer.settings import TrainerSpec

SPLITS = {
    "one": [list(range(8))],
    "eight": [[i] for i in range(8)],
    "three_five": [[0, 1, 2], [3, 4, 5, 6, 7]],
}


def _worker(path, aggregation="token-mean", lr=1e-3, eps=1e-8, **loss_kw):
    loss = LossSettings(loss_aggregation=aggregation, **loss_kw)
    return PolicyWorker(path, device="cpu", optim=OptimSettings(lr=lr, eps=eps), loss=loss, seed=0)


def _samples(worker, n=8, seed=11):
    samples = make_samples(n, seed=seed)
    # old logprobs near the current policy (a realistic ratio ~ 1, so some tokens clip and some do not)
    return [
        replace(s, old_logprobs=[x + 0.1 * ((i % 5) - 2) for i, x in enumerate(lp)])
        for s, lp in zip(samples, worker.compute_logprobs(samples, 1.0), strict=True)
    ]


def test_compute_logprobs_matches_separate_forwards(tiny_path):
    worker = PolicyWorker(tiny_path, device="cpu", max_tokens_per_micro_batch=24)
    samples = make_samples(8, seed=2)
    got = worker.compute_logprobs(samples, temperature=0.6)
    with torch.no_grad():
        for s, lp in zip(samples, got, strict=True):
            torch.testing.assert_close(
                torch.tensor(lp), naive_logprobs(worker.model, s, 0.6), atol=1e-5, rtol=0
            )


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_gradient_and_update_do_not_depend_on_the_micro_batch_split(tiny_path, aggregation):
    grads, weights = {}, {}
    for split_name, split in SPLITS.items():
        # Adam's first step is lr * g / (|g| + eps). Float-summation noise of ~1e-9 on a 1e-7 gradient entry
        # is a 1% change of g/|g| when eps is tiny, so eps = 1e-4 (well above that noise, still a real step).
        worker = _worker(tiny_path, aggregation, lr=1e-2, eps=1e-4)
        initial = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
        samples = _samples(worker)
        tokens, seqs = minibatch_totals(samples)
        worker.model.train()
        worker.accumulate(samples, split, total_tokens=tokens, total_seqs=seqs)
        grads[split_name] = {n: p.grad.clone() for n, p in worker.model.named_parameters()}
        worker._optimizer_step()
        weights[split_name] = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    for split_name in ("eight", "three_five"):
        for name, g in grads["one"].items():
            torch.testing.assert_close(
                grads[split_name][name], g, atol=1e-6, rtol=0, msg=f"{split_name} {name}"
            )
            # that first step turns a gradient difference d into up to d * lr / eps = 100 d: the splits'
            # ~1e-8 of summation noise moved weights by up to 7.6e-7 (SSE4.2 build path, 5e-7 with AVX-512),
            # too close to 1e-6 for other CPUs; a wrong step (twice, or per micro-batch) moves them by ~lr
            torch.testing.assert_close(weights[split_name][name], weights["one"][name], atol=1e-5, rtol=0)
    moved = max((weights["one"][n] - initial[n]).abs().max().item() for n in initial)
    assert moved > 1e-3


def test_kept_head_logits_give_the_same_gradients(tiny_path):
    """train.keep_head_logits: the backward reads the forward's logits instead of recomputing them; the
    gradients (entropy in the loss too, so the head's full backward runs) are those of the recomputing path."""
    grads = {}
    for keep in (False, True):
        worker = _worker(tiny_path, entropy_coef=0.01)
        worker.keep_head_logits = keep
        samples = _samples(worker)
        tokens, seqs = minibatch_totals(samples)
        worker.model.train()
        worker.accumulate(samples, SPLITS["three_five"], total_tokens=tokens, total_seqs=seqs)
        grads[keep] = {n: p.grad.clone() for n, p in worker.model.named_parameters()}
    assert any(g.abs().max() > 0 for g in grads[True].values())
    for name, g in grads[False].items():
        torch.testing.assert_close(grads[True][name], g, atol=1e-6, rtol=1e-5, msg=name)


def test_update_metrics_and_token_budget_split(tiny_path):
    worker = _worker(tiny_path, lr=1e-2)
    worker.max_tokens = max(s.num_tokens for s in make_samples(8, seed=11))
    samples = _samples(worker)
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    m = worker.update(
        samples, **dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))
    )
    for key in ("loss/policy", "loss/total", "entropy", "clipfrac", "approx_kl", "grad_norm", "lr", "tokens"):
        assert key in m and torch.isfinite(torch.tensor(m[key])), key
    assert m["micro_batches"] > 1 and m["tokens"] == sum(s.num_tokens for s in samples)
    assert 0 < m["clipfrac"] < 1 and m["lr"] == pytest.approx(1e-2) and m["skipped"] == 0
    assert worker.step == 1
    assert any(not torch.equal(before[n], p) for n, p in worker.model.named_parameters())
    assert all(p.grad is None for p in worker.model.parameters())


def test_on_policy_update_reports_the_sampler_mismatch_from_its_own_logprobs(tiny_path):
    """No old logprobs: the update's detached logprobs are the old ones (ratio 1) and it reports
    |trainer - sampler| over the SAMPLED tokens (loss mask 1), split over micro-batches like any mean; a tool
    token (mask 0, sampler logprob 0.0 as a multi-turn episode records it) is not a mismatch."""
    worker = _worker(tiny_path)
    samples = make_samples(8, seed=5, with_old=False)
    samples = [  # tool tokens with sampler logprob 0.0: their gap would dominate mean and max
        replace(s, sampler_logprobs=[x * m for x, m in zip(s.sampler_logprobs, s.loss_mask, strict=True)])
        for s in samples
    ]
    assert any(0 in s.loss_mask for s in samples)
    worker.max_tokens = max(s.num_tokens for s in samples + make_samples(8, seed=5))
    current = worker.compute_logprobs(samples, 1.0)
    diffs = [
        abs(a - b)
        for s, lp in zip(samples, current, strict=True)
        for a, b, m in zip(lp, s.sampler_logprobs, s.loss_mask, strict=True)
        if m
    ]
    totals = dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))
    m = worker.update(samples, **totals)
    assert m["micro_batches"] > 1
    assert m["rollout/logprob_diff_mean"] == pytest.approx(sum(diffs) / len(diffs), rel=1e-5)
    assert m["rollout/logprob_diff_max"] == pytest.approx(max(diffs), rel=1e-5)
    assert m["clipfrac"] == 0.0 and m["ratio"] == pytest.approx(1.0)
    with_old = make_samples(8, seed=5)  # given old logprobs, the mismatch is the controller's to report
    assert "rollout/logprob_diff_mean" not in worker.update(with_old, **totals)


def test_kl_loss_uses_a_frozen_reference(tiny_path):
    worker = _worker(tiny_path, kl_loss_coef=0.1, kl_estimator="k3")
    assert worker.reference is not None and not any(p.requires_grad for p in worker.reference.parameters())
    samples = _samples(worker)
    ref = worker.compute_logprobs(samples, 1.0, which="reference")
    pol = worker.compute_logprobs(samples, 1.0)
    assert ref == pol  # identical weights before any update
    samples = [replace(s, ref_logprobs=r) for s, r in zip(samples, ref, strict=True)]
    tokens, seqs = minibatch_totals(samples)
    m = worker.update(samples, total_tokens=tokens, total_seqs=seqs)
    assert m["loss/kl"] == pytest.approx(0.0, abs=1e-6)
    m = worker.update(samples, total_tokens=tokens, total_seqs=seqs)
    assert m["loss/kl"] > 0
    assert len(list(worker.optimizer.param_groups[0]["params"])) > 0
    assert worker.compute_logprobs(samples[:1], 1.0, which="reference")[0] == ref[0]


def test_no_reference_without_kl(tiny_path):
    worker = _worker(tiny_path)
    assert worker.reference is None
    with pytest.raises(ValueError, match="no reference model"):
        worker.compute_logprobs(make_samples(1), which="reference")


def test_save_load_round_trip(tiny_path, tmp_path):
    worker = _worker(tiny_path, lr=1e-2)
    samples = _samples(worker)
    tokens, seqs = minibatch_totals(samples)
    worker.update(samples, total_tokens=tokens, total_seqs=seqs)
    worker.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()
    follow = worker.update(samples, total_tokens=tokens, total_seqs=seqs)
    after = {n: t.clone() for n, t in worker.named_weights()}

    fresh = _worker(tiny_path, lr=1e-2)
    fresh.load(tmp_path / "ckpt")
    assert fresh.step == 1
    again = fresh.update(samples, total_tokens=tokens, total_seqs=seqs)
    assert again["loss/policy"] == pytest.approx(follow["loss/policy"], abs=1e-6)
    for name, t in fresh.named_weights():
        torch.testing.assert_close(t, after[name], atol=1e-6, rtol=0, msg=name)


def test_named_weights_are_hf_names(tiny_path):
    worker = _worker(tiny_path)
    names = [n for n, _ in worker.named_weights()]
    assert "model.embed_tokens.weight" in names and "model.layers.0.self_attn.q_proj.weight" in names
    assert "lm_head.weight" not in names  # tied to the embedding, sent once


def test_out_of_memory_says_what_to_lower(tiny_path, monkeypatch):
    worker = _worker(tiny_path)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(policy_mod, "token_logprobs", oom)
    samples = make_samples(2)
    with pytest.raises(
        TrainerOutOfMemory, match="train.max_tokens_per_micro_batch=8192.*gradient_checkpointing"
    ):
        worker.update(samples, total_tokens=10, total_seqs=2)


def test_from_spec(tiny_path):
    spec = TrainerSpec(
        str(tiny_path),
        device="cpu",
        optim=OptimSettings(lr=3e-4, warmup_steps=2, schedule="cosine", total_steps=10),
        loss=LossSettings(loss_aggregation="seq-mean-token-sum-norm", max_len=32, rollout_correction="tis"),
        max_tokens_per_micro_batch=64,
    )
    worker = PolicyWorker.from_spec(spec)
    assert worker.max_tokens == 64 and worker.loss_settings.max_len == 32
    assert worker.loss_settings.rollout_correction == "tis"
    assert worker.scheduler.get_last_lr()[0] == pytest.approx(1.5e-4)
    samples = _samples(worker)
    m = worker.update(samples, total_tokens=1.0, total_seqs=8.0)
    assert "rollout_is_weight_mean" in m and "rollout_is_log_weight_abs_max" in m


def test_bf16_autocast_keeps_fp32_master_weights(tiny_path):
    worker = PolicyWorker(
        tiny_path,
        device="cpu",
        dtype="bf16",
        gradient_checkpointing=True,
        loss=LossSettings(kl_loss_coef=0.1),
    )
    samples = _samples(worker)
    refs = worker.compute_logprobs(samples, which="reference")
    samples = [replace(s, ref_logprobs=r) for s, r in zip(samples, refs, strict=True)]
    m = worker.update(samples, total_tokens=50.0, total_seqs=8.0)
    assert all(torch.isfinite(torch.tensor(v)) for v in m.values())
    assert all(p.dtype == torch.float32 for p in worker.model.parameters())
    assert next(worker.reference.parameters()).dtype == torch.bfloat16


def _state(worker):
    opt = worker.optimizer.state_dict()
    moments = [(k, n, t.clone()) for k, s in opt["state"].items() for n, t in sorted(s.items())]
    weights = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    return weights, moments, worker.scheduler.state_dict()["last_epoch"], worker.step


def _same(a, b) -> bool:
    (wa, ma, la, sa), (wb, mb, lb, sb) = a, b
    return (
        all(torch.equal(wa[n], wb[n]) for n in wa)
        and len(ma) == len(mb)
        and all(x[:2] == y[:2] and torch.equal(x[2], y[2]) for x, y in zip(ma, mb, strict=True))
        and (la, sa) == (lb, sb)
    )


def test_a_mini_batch_not_stepped_leaves_weights_and_optimizer_bit_identical(tiny_path):
    """All advantages zero: the controller sends step=False. After a real step (AdamW has momentum) and with
    weight decay, such a mini-batch still moves the weights when stepped; not stepped, weights, moments,
    step count and LR schedule are bit-identical, and the metrics are still reported."""
    worker = PolicyWorker(
        tiny_path, device="cpu", optim=OptimSettings(lr=1e-2, weight_decay=0.1), loss=LossSettings(), seed=0
    )
    samples = make_samples(8, seed=3)
    totals = dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))
    worker.update(samples, **totals)
    zero = [replace(s, advantages=[0.0] * len(s.advantages)) for s in samples]
    before = _state(worker)
    m = worker.update(zero, **totals, step=False)
    assert m["grad_norm"] == 0.0 and m["loss/policy"] == 0.0 and m["entropy"] > 0 and m["skipped"] == 0
    assert _same(before, _state(worker))
    assert all(p.grad is None for p in worker.model.parameters())
    worker.update(zero, **totals)  # stepped (train.step_on_zero_advantage=true): momentum and decay move it
    after = _state(worker)
    assert not any(torch.equal(before[0][n], after[0][n]) for n in before[0] if n.endswith("proj.weight"))
    assert after[2:] == (before[2] + 1, before[3] + 1)


def test_a_resume_trains_at_this_runs_lr_not_the_checkpoints(tiny_path, tmp_path):
    """A resume that changes train.lr (accepted with --accept-changes, e.g. after a divergence) steps at the
    new peak lr, at the schedule's saved position (here the 2nd of 4 warm-up steps)."""
    samples = make_samples(4, seed=1)
    totals = dict(zip(("total_tokens", "total_seqs"), minibatch_totals(samples), strict=True))
    old = PolicyWorker(tiny_path, device="cpu", optim=OptimSettings(lr=1e-3, warmup_steps=4), seed=0)
    old.update(samples, **totals)
    old.save(tmp_path / "ckpt")
    new = PolicyWorker(tiny_path, device="cpu", optim=OptimSettings(lr=2e-5, warmup_steps=4), seed=0)
    new.load(tmp_path / "ckpt")
    assert new.step == 1 and new.update(samples, **totals)["lr"] == pytest.approx(2e-5 * 2 / 4)
    assert new.scheduler.get_last_lr()[0] == pytest.approx(2e-5 * 3 / 4)


def test_the_sum_pi_squared_pass_gives_the_same_logprobs_and_the_full_logits_sum(tiny_path):
    """Σπ² (the optimal-token baseline's statistic) comes from the old-logprob forward: its logprobs are
    compute_logprobs' bit for bit, its Σπ² that of the full logits at the temperature."""
    worker = PolicyWorker(tiny_path, device="cpu", logprob_chunk_tokens=5)
    samples = make_samples(5)
    logprobs, sums = worker.compute_logprobs_and_sum_pi_squared(samples, 0.7)
    assert logprobs == worker.compute_logprobs(samples, 0.7)
    model = worker.model
    for s, row in zip(samples, sums, strict=True):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0, len(s.prompt_ids) - 1 : -1].float() / 0.7
        want = torch.softmax(logits, -1).pow(2).sum(-1)
        torch.testing.assert_close(torch.tensor(row), want, atol=1e-6, rtol=1e-5)
