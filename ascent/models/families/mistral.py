"""Mistral (dense, text): the Llama layout with a sliding attention window."""

from ascent.models.families.llama_like import llama_like

FAMILY = llama_like("mistral")
