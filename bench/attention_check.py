"""Does the trainer's packed attention path change the gradient? (GPU diagnostic, prints numbers.)

Builds the 13M-parameter model of the GPU learning run (examples/arithmetic/run_gpu.sh) and one SFT
micro-batch of 3-digit addition pairs rendered with its chat template, then computes the SFT loss
(token-mean NLL of the response tokens) and its gradient in five ways:

    fp32 sdpa (the reference), bf16-autocast sdpa, bf16-autocast varlen,
    and both bf16 paths again with gradient checkpointing on.

For each bf16 path it prints the relative error of the logprobs and of every parameter's gradient against
the fp32 reference. bf16 sdpa's own error is the yardstick: a varlen error far above it is a bug, not
rounding.

    python3 bench/attention_check.py [--sequences 128] [--out report.json]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU only the sdpa rows run (a dry run)


def _samples(tok, n: int, seed: int):
    from ascent.data import render_sft_examples
    from ascent.entrypoints.sft import sft_samples

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(1000), rng.randrange(1000)
        rows.append({"prompt": f"{a}+{b}=", "response": str(a + b)})
    return sft_samples(render_sft_examples(rows, tok, max_prompt_tokens=32))


def _run(path: Path, samples, attention: str, dtype: str, grad_ckpt: bool):
    """-> (logprobs [M] fp32, {param name: grad fp32})."""
    from transformers import AutoModelForCausalLM

    from ascent.models import varlen
    from ascent.trainer.logprobs import token_logprobs
    from ascent.trainer.packing import pack

    model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa").to(DEVICE)
    if attention == "varlen":
        assert varlen.enable_varlen_attention(model), "varlen attention is not available here"
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    packed = pack(samples, DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=dtype == "bf16"):
        lp, _ = token_logprobs(model, packed)
    (-lp.mean()).backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach().float(), grads


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args()

    from ascent.models.loading import load_tokenizer
    from ascent.models.tiny import make_tiny_checkpoint

    tmp = Path(tempfile.mkdtemp())
    path = make_tiny_checkpoint(
        tmp / "base", hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, seed=0
    )
    samples = _samples(load_tokenizer(str(path)), a.sequences, a.seed)
    lengths = [s.num_tokens for s in samples]
    print(f"{len(samples)} sequences, {sum(lengths)} tokens, lengths {min(lengths)}-{max(lengths)}")

    ref_lp, ref_g = _run(path, samples, "sdpa", "fp32", False)
    report: dict[str, dict[str, float | str]] = {}
    for name, attention, ckpt in (
        ("bf16 sdpa", "sdpa", False),
        ("bf16 varlen", "varlen", False),
        ("bf16 sdpa + ckpt", "sdpa", True),
        ("bf16 varlen + ckpt", "varlen", True),
    ):
        if attention == "varlen" and DEVICE == "cpu":
            continue
        lp, g = _run(path, samples, attention, "bf16", ckpt)
        per_param = {n: _rel(g[n], ref_g[n]) for n in ref_g}
        worst = max(per_param, key=per_param.__getitem__)
        total = _rel(
            torch.cat([g[n].flatten() for n in ref_g]), torch.cat([ref_g[n].flatten() for n in ref_g])
        )
        lp_err = float((lp - ref_lp).abs().max())
        report[name] = {
            "logprob_max_abs": lp_err,
            "grad_rel_total": total,
            "grad_rel_worst": per_param[worst],
            "worst_param": worst,
        }
        print(
            f"{name:20s} logprob max|d| {lp_err:.2e}  grad rel {total:.2e}  "
            f"worst {per_param[worst]:.2e} ({worst})"
        )
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
