"""Qwen2.5-VL: a windowed-attention vision tower, a 2x2 patch merger and a Qwen2 language model with mrope."""

from ascent.models.families.qwen_vl import qwen_vl

FAMILY = qwen_vl("qwen2_5_vl")
