"""Qwen2 and Qwen2.5 (text): the Llama layout with biases on q/k/v and an optional sliding window."""

from ascent.models.families.llama_like import llama_like

FAMILY = llama_like("qwen2")
