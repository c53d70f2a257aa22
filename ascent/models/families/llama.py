"""Llama 2/3 (text): the reference layout of the Llama-like families (Llama 3's `llama3` RoPE included)."""

from ascent.models.families.llama_like import llama_like

FAMILY = llama_like("llama")
