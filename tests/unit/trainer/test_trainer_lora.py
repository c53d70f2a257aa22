"""LoRA: adapters train, the reference is the base with adapters off, merged weights load into a plain
model."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trainer_helpers import make_samples, naive_logprobs
from transformers import AutoModelForCausalLM

from ascent.trainer import LoraSettings, LossSettings, OptimSettings, PolicyWorker, minibatch_totals
from ascent.trainer.lora import ADAPTER_DIR

pytest.importorskip("peft")


def _lora_worker(path, save_merged=True):
    return PolicyWorker(
        path,
        device="cpu",
        lora=LoraSettings(
            rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "up_proj"), save_merged=save_merged
        ),
        optim=OptimSettings(lr=5e-2),
        loss=LossSettings(kl_loss_coef=0.05),
        seed=0,
    )


def _train(worker, steps=2):
    samples = make_samples(6, seed=4)
    refs = worker.compute_logprobs(samples, 1.0, which="reference")
    samples = [replace(s, ref_logprobs=r) for s, r in zip(samples, refs, strict=True)]
    tokens, seqs = minibatch_totals(samples)
    for _ in range(steps):
        worker.update(samples, total_tokens=tokens, total_seqs=seqs)
    return samples


@pytest.fixture(scope="module")
def trained(tiny_path):
    worker = _lora_worker(tiny_path)
    return worker, _train(worker)


def test_only_adapters_train_and_no_reference_copy(trained):
    worker, _ = trained
    assert worker.reference is None
    trainable = {n for n, p in worker.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    n_opt = sum(len(g["params"]) for g in worker.optimizer.param_groups)
    assert n_opt == len(trainable)


def test_reference_logprobs_equal_base_model(trained, tiny_model):
    worker, samples = trained
    ref = worker.compute_logprobs(samples, 1.0, which="reference")
    pol = worker.compute_logprobs(samples, 1.0)
    with torch.no_grad():
        for s, r in zip(samples, ref, strict=True):
            base = naive_logprobs(tiny_model, s)
            torch.testing.assert_close(torch.tensor(r), base, atol=1e-5, rtol=0)
    assert max(abs(a - b) for r, p in zip(ref, pol, strict=True) for a, b in zip(r, p, strict=True)) > 1e-3


def test_named_weights_are_merged_and_load_into_a_plain_model(trained, tiny_path, tiny_model):
    worker, samples = trained
    merged = dict(worker.named_weights())
    base = dict(tiny_model.named_parameters())
    assert set(merged) == set(base)  # plain HF names, no peft prefixes, tied lm_head once
    assert not torch.allclose(
        merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    torch.testing.assert_close(
        merged["model.layers.0.self_attn.k_proj.weight"], base["model.layers.0.self_attn.k_proj.weight"]
    )
    plain = AutoModelForCausalLM.from_pretrained(str(tiny_path), local_files_only=True)
    missing, unexpected = plain.load_state_dict(merged, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    pol = worker.compute_logprobs(samples, 1.0)
    with torch.no_grad():
        for s, p in zip(samples, pol, strict=True):
            torch.testing.assert_close(naive_logprobs(plain, s), torch.tensor(p), atol=1e-5, rtol=0)


def test_checkpoint_has_merged_weights_and_adapter(trained, tiny_path, tmp_path):
    worker, samples = trained
    worker.save(tmp_path)
    assert (tmp_path / ADAPTER_DIR / "adapter_config.json").is_file()
    from_disk = AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True)
    pol = worker.compute_logprobs(samples[:2], 1.0)
    with torch.no_grad():
        torch.testing.assert_close(
            naive_logprobs(from_disk, samples[0]), torch.tensor(pol[0]), atol=1e-5, rtol=0
        )
    resumed = _lora_worker(tiny_path)
    resumed.load(tmp_path)
    for got, want in zip(resumed.compute_logprobs(samples[:2], 1.0), pol, strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    assert resumed.step == worker.step


def test_adapter_only_checkpoint(tiny_path, tmp_path):
    worker = _lora_worker(tiny_path, save_merged=False)
    worker.save(tmp_path)
    assert (tmp_path / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "model.safetensors").exists()
