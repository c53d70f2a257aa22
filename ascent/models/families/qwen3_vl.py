"""Qwen3-VL: a vision tower with deepstack features fed into early decoder layers, and a Qwen3 language model
with interleaved mrope."""

from ascent.models.families.qwen_vl import qwen_vl

FAMILY = qwen_vl("qwen3_vl")
