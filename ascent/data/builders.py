"""From config to data: the one place the data package reads config sections (design: "config stops at the
edge").

`load_prompts` / `load_sft_examples` take flat arguments (load -> validate -> render); the `*_from_config`
helpers only pick those arguments out of a `DataConfig` / `SFTConfig`; `image_codec` loads a
vision-language model's image codec with the `model.min_pixels` / `model.max_pixels` budget;
`processors_from_config` builds the steps of `data.processors` (`ascent.data.processors`).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ascent.config.processors import DifficultyProcessor, FilterProcessor, TransformProcessor
from ascent.data import processors as P
from ascent.data.fields import prepare_rows
from ascent.data.loading import load_rows
from ascent.data.prompts import Overlong, PromptItem, RenderReport, Side, render_prompts
from ascent.data.sft import SFTExample, render_sft_examples_and_report
from ascent.data.validation import DataError, validate_rows
from ascent.plugins import load_plugin

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ascent.config.schema import DataConfig, SFTConfig
    from ascent.models.vision import ImageCodec


def image_codec(
    path: str,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    tokenizer_field: str = "model.tokenizer_path",
) -> ImageCodec | None:
    """The image codec of the vision-language checkpoint in `path` (`model.path`) under the pixel budget
    `model.min_pixels` / `model.max_pixels` (None: the checkpoint's); None for a text model, where a
    pixel budget is refused (nothing would read it). With `tokenizer` (named by `tokenizer_field`), a
    tokenizer that cannot write the model's image token is refused too (a text model's, say)."""
    from ascent.models.vision import (  # deferred: imports torch
        image_token_id,
        load_image_codec,
        tokenizer_problem,
    )

    if image_token_id(Path(path)) is None:
        for name, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
            if value is not None:
                raise DataError(
                    f"model.{name}={value}: model.path={path!r} is a text-only model, which sees no images; "
                    f"remove model.{name} or point model.path at a vision-language checkpoint."
                )
        return None
    codec = load_image_codec(path, min_pixels, max_pixels)
    problem = None if tokenizer is None else tokenizer_problem(tokenizer, codec.image_token_id)
    if problem is not None:
        raise DataError(
            f"{tokenizer_field}={getattr(tokenizer, 'name_or_path', '?')!r}: {problem}; model.path={path!r} is a vision-language model. Use the tokenizer "
            "that came with it (unset model.tokenizer_path to use model.path's)."
        )
    return codec


def load_prompts(
    path: str,
    tokenizer: Any,
    *,
    source: str,
    max_prompt_tokens: int,
    overlong: Overlong = "drop",
    truncation_side: Side = "left",
    chat_template: bool = True,
    max_rows: int | None = None,
    codec: ImageCodec | None = None,
) -> tuple[list[PromptItem], RenderReport]:
    """Read, validate and render one prompt file; `max_rows` keeps only the first rows (validation sets);
    `codec` renders rows that show images (a vision-language model's, `image_codec`)."""
    rows = load_rows(path, source=source)[:max_rows]
    validate_rows(rows, source, tokenizer_vocab_size=len(tokenizer))
    return render_prompts(
        rows,
        tokenizer,
        max_prompt_tokens=max_prompt_tokens,
        overlong=overlong,
        truncation_side=truncation_side,
        chat_template=chat_template,
        source=source,
        codec=codec,
    )


def _split_path(data: DataConfig, split: str) -> tuple[str, str]:
    if split not in ("train", "val"):
        raise ValueError(f"split={split!r}: use 'train' or 'val'.")
    path = data.train_path if split == "train" else data.val_path
    field = f"data.{split}_path"
    if not path:
        raise DataError(f"{field} is not set; point it at a .jsonl or .parquet file.")
    return path, f"{field}={path}"


def prompts_from_config(
    data: DataConfig, tokenizer: Any, split: str = "train", codec: ImageCodec | None = None
) -> tuple[list[PromptItem], RenderReport]:
    """The train or val prompts described by a DataConfig section (`codec`: see `load_prompts`)."""
    path, source = _split_path(data, split)
    return load_prompts(
        path,
        tokenizer,
        source=source,
        max_prompt_tokens=data.max_prompt_tokens,
        overlong=data.overlong_prompts,
        truncation_side=data.truncation_side,
        chat_template=data.chat_template,
        max_rows=data.max_val_prompts if split == "val" else None,
        codec=codec,
    )


def sft_examples_from_config(
    cfg: SFTConfig,
    tokenizer: PreTrainedTokenizerBase,
    split: str = "train",
    *,
    max_total_tokens: int | None = None,
    codec: ImageCodec | None = None,
) -> tuple[list[SFTExample], RenderReport]:
    """The train or val prompt/response pairs described by an SFTConfig (`codec`: see `load_prompts`):
    `data.processors` run on the training rows, `data.max_val_prompts` keeps the first validation rows, and
    `data.overlong_prompts` / `data.truncation_side` / `turn_end_loss` shape the pairs (`ascent sft` reads
    its data here)."""
    path, source = _split_path(cfg.data, split)
    d = cfg.data
    rows = prepare_rows(
        load_rows(path, source=source, split=d.split),
        source,
        prompt_key=d.prompt_key,
        answer_key=d.answer_key,
        system_prompt=d.system_prompt,
    )
    if split == "val":
        rows = rows[: cfg.data.max_val_prompts]
    else:
        rows = P.run_steps(rows, processors_from_config(d), source)
    return render_sft_examples_and_report(
        rows,
        tokenizer,
        response_key=cfg.response_key,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        max_total_tokens=max_total_tokens,
        overlong=cfg.data.overlong_prompts,
        truncation_side=cfg.data.truncation_side,
        chat_template=cfg.data.chat_template,
        source=source,
        codec=codec,
        turn_end_loss=cfg.turn_end_loss,
    )


def processors_from_config(data: DataConfig) -> list[tuple[str, P.Step]]:
    """The steps of `data.processors`, each labelled `data.processors[i] (name)` for logs and errors; the
    plug-ins are imported here (a path that does not resolve is a PluginError naming the entry)."""
    steps: list[tuple[str, P.Step]] = []
    for i, proc in enumerate(data.processors):
        field = f"data.processors[{i}]"
        label = f"{field} ({proc.name})"
        kwargs = getattr(proc, "kwargs", {})
        if isinstance(proc, FilterProcessor):
            keep = partial(load_plugin(proc.fn, f"{field}.fn"), **kwargs)
            steps.append((label, partial(P.filter_rows, keep=keep)))
        elif isinstance(proc, TransformProcessor):
            fn = partial(load_plugin(proc.fn, f"{field}.fn"), **kwargs)
            steps.append((label, partial(P.transform_rows, fn=fn)))
        elif isinstance(proc, DifficultyProcessor):
            rate = (
                P.column_rate(proc.column)
                if proc.column
                else P.store_pass_rates(proc.store or "", proc.success, f"{field}.store")
            )
            steps.append((label, partial(P.difficulty_rows, rate=rate, low=proc.low, high=proc.high)))
        else:
            steps.append((label, partial(load_plugin(proc.name, f"{field}.name"), **kwargs)))
    return steps
