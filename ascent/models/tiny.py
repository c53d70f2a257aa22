"""Tiny-model factory: a small Qwen2-architecture checkpoint and a character-level tokenizer, on disk.

Tests and the demo never touch a model hub. They call `make_tiny_checkpoint(dir)`, which writes a real
Hugging Face checkpoint (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with a chat
template) that `ascent.models.load_model` / `load_tokenizer` then read through the ordinary
`from_pretrained` path, exactly as they would read Qwen2.5.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

# Special tokens come first so their ids are stable: pad=0, eos=1 (<|im_end|>), bos=2 (<|im_start|>).
SPECIAL_TOKENS = ["<|pad|>", "<|im_end|>", "<|im_start|>", "<|endoftext|>"]
DEFAULT_CHARS = string.digits + string.ascii_letters + " +-*/=#.,:;?!()[]<>'\"\n_"

# Qwen2's pre-tokenizer split (the same as Qwen2Tokenizer builds), so text splits alike on every load path.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)

# A compact ChatML-style template (the one Qwen uses), kept short because every character is a token.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'][0] }}{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>a{% endif %}"
)


def byte_level_chars() -> dict[int, str]:
    """Byte -> the printable character byte-level BPE writes it as (GPT-2's table: printable bytes stand for
    themselves, the others are shifted past 255; space is 'Ġ', newline 'Ċ')."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def make_char_tokenizer(
    out_dir: str | Path,
    chars: str = DEFAULT_CHARS,
    words: Sequence[str] = (),
    special: Sequence[str] = (),
    chat_template: str = CHAT_TEMPLATE,
):
    """Write a character-level tokenizer with a chat template to `out_dir`; return it.

    It is Qwen2's own format, a byte-level BPE, with one token per character of `chars` and no merges, so
    every loader reads it the same way (transformers picks `Qwen2Tokenizer` for a qwen2 checkpoint and
    rebuilds the pre-tokenizer; a tokenizer of another kind lost its spaces there). The special tokens are
    whole tokens, and so is each of `words` (ordinary added tokens that decode as text, as Qwen's
    `<tool_call>`). Characters outside `chars` are dropped, as Qwen2Tokenizer drops what its vocabulary lacks.
    `special` adds special tokens after the fixed four (a vision-language model's `<|image_pad|>` and its
    kin, ids from 4 on); `chat_template` replaces the text-only template.
    """
    # deferred: tokenizers and transformers, slow to import
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_char = byte_level_chars()
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *special])}
    for ch in dict.fromkeys(chars):
        vocab.setdefault("".join(byte_char[b] for b in ch.encode()), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([*SPECIAL_TOKENS, *special])
    tok.add_tokens([AddedToken(w, normalized=False) for w in words])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
    )
    if special:
        fast.add_special_tokens({"additional_special_tokens": list(special)})
    fast.chat_template = chat_template
    fast.save_pretrained(str(out_dir))
    return fast


def make_tiny_checkpoint(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    chars: str = DEFAULT_CHARS,
    words: Sequence[str] = (),
    seed: int = 0,
    tie_word_embeddings: bool = True,
) -> Path:
    """Write a randomly initialised Qwen2 causal LM plus its char tokenizer to `out_dir`; return the path.

    Grouped-query attention is on by default (num_kv_heads < num_heads) so the same code paths run as for
    Qwen2.5. The checkpoint is fp32 safetensors, loadable with `AutoModelForCausalLM.from_pretrained`.
    """
    # deferred: torch and transformers, slow to import
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_char_tokenizer(out, chars, words)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def make_tiny_reward_model(
    out_dir: str | Path, *, hidden_size: int = 32, num_layers: int = 1, seed: int = 0
) -> Path:
    """Write a randomly initialised Qwen2ForSequenceClassification with one label (a reward model) plus the
    char tokenizer to `out_dir`; return the path."""
    # deferred: torch and transformers, slow to import
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_char_tokenizer(out)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    config.num_labels = 1  # one scalar score (a PretrainedConfig attribute the Qwen2Config stubs omit)
    torch.manual_seed(seed)
    Qwen2ForSequenceClassification(config).save_pretrained(str(out), safe_serialization=True)
    return out


def make_tiny_moe_checkpoint(
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_experts: int = 8,
    experts_per_token: int = 2,
    moe_intermediate_size: int = 32,
    router_scale: float = 1.0,
    expert_scale: float = 1.0,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised Qwen3-MoE causal LM (every layer sparse: `num_experts` SwiGLU experts,
    top-`experts_per_token` routing with normalised weights) plus the char tokenizer; return the path.

    `router_scale` multiplies the routers' initial weights: below 1 the router logits of a token lie close
    together, so a small change in the hidden state (another dtype, another kernel) picks other experts,
    the sensitivity routing replay exists for; `expert_scale` multiplies the experts' weights (above 1 the
    experts' outputs weigh more against the residual stream, so which experts a token gets matters more).
    Saved as transformers saves a real Qwen3-MoE checkpoint (one tensor per expert)."""
    # deferred: torch and transformers, slow to import
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_char_tokenizer(out)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        moe_intermediate_size=moe_intermediate_size,
        num_experts=num_experts,
        num_experts_per_tok=experts_per_token,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.mul_(router_scale)
            elif ".mlp.experts." in name:
                p.mul_(expert_scale)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    return out
