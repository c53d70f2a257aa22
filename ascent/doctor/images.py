"""Doctor check of the images a run shows its model: the pixel budget (`model.min_pixels` /
`model.max_pixels`, else the checkpoint's preprocessor_config.json), how many image tokens each image of the
first rows becomes (min / median / max), the frames its videos become (`ascent.data.images`: a video is
shown as its sampled frames, each an image) and their image tokens, and the rows the run would leave out: an
image or video that cannot be used (missing, unreadable, not an image) or a prompt whose text and image
tokens are over data.max_prompt_tokens.
Images in the data of a text-only model, an image processor cut for another vision tower, and a tokenizer
without the model's image token (a text model's) fail here, before a run.

For an image environment (`rollout.source` an env whose rows carry `image`, `frames` or `video`) the same
report comes from the first prompts the environment makes of those rows (`ascent.doctor.env_images`); an
agent's prompts are not checked.

Reads the first `HEAD_ROWS` rows of `data.train_path` only, as the data checks do.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ascent.config.schema import RunConfig
from ascent.config.sources import EnvSourceConfig
from ascent.data.images import BadImageRow, decode_images, frame_of, image_prompt, row_has_images
from ascent.doctor.data import HEAD_ROWS, HeadError, head_rows
from ascent.doctor.env_images import FIX_RESET, EnvResetFailed, carries_images, measure_env_rows
from ascent.doctor.report import CheckResult, fail, ok, skipped, warn
from ascent.errors import AscentError
from ascent.messages import ImageInput
from ascent.models.content import IMAGES_COLUMN, ContentError, resolve_paths
from ascent.orchestrator.episodes import env_hosts

NAME = "images"
FIX_BAD = (
    "fix the image and video paths (relative paths are relative to the dataset file) or the files; the run "
    "leaves these rows out."
)
FIX_FRAMES = (
    "show fewer video frames (a video part's max_frames, nframes or fps) or smaller ones (max_pixels), "
)


def image_rows(path: str, env: bool = False) -> tuple[int, list[tuple[int, dict[str, Any]]]]:
    """(rows read, [(row number, row) for the rows of the file's head that show images]), paths resolved;
    `env`: rows of an image environment (their `image`, `frames` or `video` field) instead of messages."""
    file = Path(path).expanduser()
    if not file.is_file():
        return 0, []
    try:
        rows = head_rows(file, HEAD_ROWS)
    except HeadError:  # the data check reports it
        return 0, []
    out = []
    for i, row in enumerate(rows, start=1):
        if isinstance(row, dict) and (carries_images(row) if env else row_has_images(row)):
            resolve_paths(row, file.resolve().parent)
            out.append((i, row))
    return len(rows), out


def pixel_budget(processor: Any) -> tuple[int | None, int | None]:
    """(min, max) pixels of a Qwen-VL image processor (its `size` edges, or min_pixels/max_pixels)."""
    size = getattr(processor, "size", None) or {}
    get = size.get if hasattr(size, "get") else (lambda _k: None)
    low = get("shortest_edge") or getattr(processor, "min_pixels", None)
    high = get("longest_edge") or getattr(processor, "max_pixels", None)
    return low, high


def check_images(cfg: RunConfig) -> CheckResult:
    """See the module docstring."""
    source = cfg.rollout.source
    env = source.env if isinstance(source, EnvSourceConfig) else None
    if cfg.rollout.multi_turn and env is None:
        return skipped(NAME, "the agent makes the prompts (their images are not checked here)")
    read, rows = image_rows(cfg.data.train_path, env=env is not None)
    if env is not None and not rows:
        return skipped(
            NAME, f"the environment makes the prompts; none of the first {read} rows names an image"
        )
    from ascent.models.vision import image_token_id, load_image_codec  # deferred: torch

    m = cfg.model
    if not m.path or image_token_id(Path(m.path).expanduser()) is None:
        if rows:
            return fail(
                NAME,
                f"data.train_path row {rows[0][0]} shows images, but model.path={m.path!r} is a text-only model",
                "point model.path at a vision-language checkpoint (Qwen2.5-VL, Qwen3-VL), or take the "
                "image parts out of the data.",
            )
        return skipped(NAME, "a text-only model, and no images in the first rows")
    try:
        codec = load_image_codec(Path(m.path).expanduser(), m.min_pixels, m.max_pixels)
    except (AscentError, OSError, ValueError) as err:
        return fail(NAME, f"the image processor does not fit the model: {err}", "see the problem.")
    tokenizer, problem = _tokenizer(cfg, codec.image_token_id)
    if problem is not None:
        return fail(NAME, problem, "unset model.tokenizer_path (model.path's own tokenizer) or fix it.")
    low, high = pixel_budget(codec.processor)
    where = "model.min_pixels/max_pixels" if m.min_pixels or m.max_pixels else "preprocessor_config.json"
    budget = f"pixel budget {low}..{high} pixels ({where})"
    facts: dict[str, Any] = {"min_pixels": low, "max_pixels": high}
    if not rows:
        return ok(NAME, f"{budget}; no images in the first {read} rows", **facts)
    try:
        if env is None:
            measured = _measure(rows, codec, tokenizer)
        else:
            with env_hosts(cfg.rollout) as hosts:  # the run's isolation and timeout for user resets
                measured = measure_env_rows(rows, env, codec, tokenizer, hosts)
    except EnvResetFailed as err:
        return fail(NAME, str(err), FIX_RESET)
    shown, lengths, bad = measured
    tokens = [im.num_tokens for images in shown for im in images]
    over = [(n, length, k) for n, length, k in lengths if length > cfg.data.max_prompt_tokens]
    frame_words, frame_facts = _frames(shown)
    facts |= {"image_tokens": tokens, "bad_rows": bad, "over_rows": [n for n, _, _ in over], **frame_facts}
    stats = (
        f"image tokens per image over {len(tokens)} images of the first {read} rows: min {min(tokens)}, "
        f"median {statistics.median(tokens):g}, max {max(tokens)}"
        if tokens
        else "no usable image"
    )
    detail = f"{budget}; {stats}{frame_words}"
    problems = []
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        problems.append((f"{len(bad)} rows with an unusable image: {bad[0]}{more}", FIX_BAD))
    if over:
        n, length, k = over[0]
        more = f" (and {len(over) - 1} more)" if len(over) > 1 else ""
        problems.append(
            (
                f"{len(over)} rows over data.max_prompt_tokens={cfg.data.max_prompt_tokens}: row {n} is "
                f"{length} tokens, {k} of them image tokens{more}",
                "lower model.max_pixels (fewer tokens per image), "
                + (FIX_FRAMES if frame_words else "")
                + "or raise data.max_prompt_tokens; the run leaves these rows out.",
            )
        )
    if problems:
        return warn(
            NAME, "; ".join([detail, *(p for p, _ in problems)]), "; ".join(f for _, f in problems), **facts
        )
    return ok(NAME, detail, **facts)


def _frames(shown: list[tuple[ImageInput, ...]]) -> tuple[str, dict[str, Any]]:
    """(the detail's words on the frames of the rows' videos, or "" without videos; their facts)."""
    per_video: dict[tuple[int, str], list[int]] = {}
    for row, images in enumerate(shown):
        for im in images:
            video = frame_of(im)
            if video is not None:
                per_video.setdefault((row, video), []).append(im.num_tokens)
    if not per_video:
        return "", {}
    counts = [len(t) for t in per_video.values()]
    tokens = [sum(t) for t in per_video.values()]
    words = (
        f"; {sum(counts)} of the images are frames of {len(counts)} videos: {min(counts)}..{max(counts)} "
        f"frames and {min(tokens)}..{max(tokens)} image tokens per video"
    )
    return words, {"video_frames": counts, "video_tokens": tokens}


def _tokenizer(cfg: RunConfig, token_id: int) -> tuple[Any, str | None]:
    """(the run's tokenizer or None when it does not load: the tokenizer check says why, the problem of a
    tokenizer that cannot write the model's image token, or None)."""
    from ascent.models.loading import load_tokenizer  # deferred: torch
    from ascent.models.vision import tokenizer_problem  # deferred: torch

    m = cfg.model
    field = "model.tokenizer_path" if m.tokenizer_path else "model.path"
    try:
        tokenizer = load_tokenizer(Path(m.tokenizer_path or m.path).expanduser(), m.trust_remote_code, field)
    except AscentError:
        return None, None
    problem = tokenizer_problem(tokenizer, token_id)
    if problem is not None:
        return None, f"{field}={m.tokenizer_path or m.path!r}: {problem}"
    # without a chat template of its own (model.chat_template may give one) a row counts its images only
    return (tokenizer if getattr(tokenizer, "chat_template", None) else None), None


def _measure(
    rows: list[tuple[int, dict[str, Any]]], codec: Any, tokenizer: Any
) -> tuple[list[tuple[ImageInput, ...]], list[tuple[int, int, int]], list[str]]:
    """(the images of every usable row, a video's frames included; (row number, prompt tokens, of them
    image tokens) per usable row; the problems of the rows the run would leave out). Without a tokenizer a
    row counts its images."""
    shown: list[tuple[ImageInput, ...]] = []
    lengths: list[tuple[int, int, int]] = []
    bad: list[str] = []
    for row_no, row in rows:
        try:
            if tokenizer is not None:
                ids, _, images = image_prompt(row, tokenizer, codec, row_no)
            else:
                _, images = decode_images(row["prompt"], row.get(IMAGES_COLUMN), codec, row_no)
                ids = []
        except BadImageRow as err:
            bad.append(err.problem)
            continue
        except (ContentError, TypeError, KeyError) as err:  # a malformed row: the run's validation names it
            bad.append(f"row {row_no}: {err}")
            continue
        image = sum(im.num_tokens for im in images)
        shown.append(tuple(images))
        lengths.append((row_no, max(len(ids), image), image))
    return shown, lengths, bad
