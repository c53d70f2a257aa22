"""Datasets: load parquet/jsonl rows, validate them, render prompts with chat templates, sample batches.

The path through this package: `load_rows` -> `validate_rows` -> `render_prompts` (RL prompts) or
`render_sft_examples` (SFT pairs) -> `PromptSampler` picks each iteration's prompts. Imports without torch.
"""

from ascent.data.builders import image_codec, load_prompts, prompts_from_config, sft_examples_from_config
from ascent.data.loading import load_rows
from ascent.data.prompts import PromptItem, RenderReport, encode_prompt, render_prompts
from ascent.data.sampler import PromptSampler
from ascent.data.sft import SFTExample, render_sft_examples, render_sft_examples_and_report
from ascent.data.validation import MESSAGE_ROLES, DataError, validate_rows

__all__ = [
    "MESSAGE_ROLES",
    "DataError",
    "PromptItem",
    "PromptSampler",
    "RenderReport",
    "SFTExample",
    "encode_prompt",
    "image_codec",
    "load_prompts",
    "load_rows",
    "prompts_from_config",
    "render_prompts",
    "render_sft_examples",
    "render_sft_examples_and_report",
    "sft_examples_from_config",
    "validate_rows",
]
