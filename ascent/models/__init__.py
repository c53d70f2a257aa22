"""Models: load Hugging Face checkpoints and tokenizers, and write the tiny test checkpoints.

`load_model` / `load_tokenizer` read local directories only; `make_tiny_checkpoint` writes a small Qwen2
checkpoint that tests and the demo load through the same path, `make_tiny_vl_checkpoint` a small
Qwen2.5-VL or Qwen3-VL one with its image processor. `families/` is the model-family registry:
per `model_type`, the classes that load it, the fast engine implementation and the weight-name mapping.
"""

from ascent.models.loading import load_model, load_tokenizer, resolve_device, torch_dtype
from ascent.models.tiny import make_tiny_checkpoint
from ascent.models.tiny_vl import make_tiny_vl_checkpoint

__all__ = [
    "load_model",
    "load_tokenizer",
    "make_tiny_checkpoint",
    "make_tiny_vl_checkpoint",
    "resolve_device",
    "torch_dtype",
]
