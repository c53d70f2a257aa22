"""The workload shared by bench/e2e.py (ours) and bench/trl_baseline.py (TRL), so both run the same thing.

A random-weight Qwen2.5-shaped checkpoint (Qwen2Config, vocab 151936, tied embeddings, bf16 on disk) written
with `save_pretrained` next to ascent's character tokenizer (its 89 ids are a subset of the model's
vocabulary; decoding drops ids it does not know), prompts of exactly `prompt_len` tokens (random characters,
no chat template), and a reward that is a deterministic coin flip on the response ids (so advantages are
non-zero and the update does real work). Also: the bf16 matrix-product peak of the device, for MFU.
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path
from typing import Any

import torch

VOCAB = 151936
SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    "7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
}
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz"


def qwen_config(shape: str) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=VOCAB,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        dtype="bfloat16",
        **{"num_key_value_heads": 2, "tie_word_embeddings": True, **SHAPES[shape]},
    )


def make_checkpoint(root: str | Path, shape: str, device: str = "cuda") -> Path:
    """Write (once) a random-weight checkpoint of `shape` plus the char tokenizer under root/<shape>."""
    from transformers import AutoModelForCausalLM

    from ascent.models.tiny import make_char_tokenizer

    out = Path(root) / f"model_{shape}"
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    make_char_tokenizer(out)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(qwen_config(shape), dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def num_params(shape: str) -> int:
    """Parameters of the model, a tied embedding counted once (the `N` of 6 * N * tokens)."""
    c = qwen_config(shape)
    h, i, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    kv = c.num_key_value_heads * (h // c.num_attention_heads)
    per_layer = h * h + 2 * h * kv + (h + 2 * kv) + h * h + 3 * h * i + 2 * h
    return VOCAB * h * (1 if c.tie_word_embeddings else 2) + n * per_layer + h


def prompt_rows(n: int, prompt_len: int, seed: int = 0) -> list[dict[str, str]]:
    """n rows of `prompt_len` random characters (one token each under the char tokenizer)."""
    rng = random.Random(seed)
    return [{"prompt": "".join(rng.choices(CHARS, k=prompt_len)), "answer": "0"} for _ in range(n)]


def write_prompts(root: str | Path, n: int, prompt_len: int) -> Path:
    path = Path(root) / f"prompts_{prompt_len}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in prompt_rows(n, prompt_len)))
    return path


def coin(ids: list[int]) -> float:
    """A deterministic 0/1 reward from the response ids (half the responses win, at random)."""
    return float(zlib.crc32(bytes(str(ids[:16]), "ascii")) % 2)


def coin_reward(prompt: str, response: str, response_ids: list[int], metadata: dict) -> float:
    """ascent's reward signature around `coin`."""
    return coin(list(response_ids))


def matmul_peak_flops(n: int = 8192, reps: int = 10) -> float:
    """bf16 FLOP/s of an n x n x n product on random data (median of `reps` after 3 warm-ups)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    times = []
    for i in range(reps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / sorted(times)[len(times) // 2]


def device_facts() -> dict[str, Any]:
    import transformers

    facts = {"torch": torch.__version__, "transformers": transformers.__version__}
    if torch.cuda.is_available():
        facts["device"] = torch.cuda.get_device_name()
        facts["total_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return facts


def report_header(args: Any) -> dict[str, Any]:
    """The start of a benchmark's JSON report: its arguments (paths as strings) and the device facts."""
    return {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "facts": device_facts(),
    }
