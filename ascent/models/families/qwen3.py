"""Qwen3 (dense, text): the Llama layout with an RMSNorm on each head's queries and keys, no q/k/v biases."""

from ascent.models.families.llama_like import llama_like

FAMILY = llama_like("qwen3")
