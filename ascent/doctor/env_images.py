"""Doctor check of the images an image environment shows (`rollout.source` an env: `zoom_qa`, `image_qa`):
the first rows that carry an `image`, `frames` or `video` field are reset on the run's environment hosts
(processes under rollout.env_timeout_s, or this process with rollout.env_isolation=inline), as the run's data
path does (`ascent.orchestrator.episodes.env_items`), and their first prompts rendered with the model's
image codec, so `ascent.doctor.images` reports their image tokens and the rows the run would leave out (an
image or video that is missing or unreadable, a prompt over data.max_prompt_tokens) as it does for data
rows. A reset that fails for another reason stops the run: it is `EnvResetFailed` here.
"""

from __future__ import annotations

from typing import Any

from ascent.envs import ChatTokens, Task
from ascent.envs.hosts import HostedEnvs, Hosts
from ascent.envs.images import split_images
from ascent.envs.rows import row_env, row_has, unusable_row
from ascent.envs.runner import EnvResetError, prompt_tokens
from ascent.messages import ImageInput
from ascent.models.content import ENV_IMAGE_FIELDS, VIDEO_FIELD

FIX_RESET = "fix the row or the environment (`ascent debug env` runs it where breakpoint() works)."


class EnvResetFailed(Exception):
    """A row's reset failed for a reason other than its image: the run would stop there."""


def carries_images(row: dict[str, Any]) -> bool:
    """Whether an environment row names images: an `image`, `frames` or `video` field (or in extra_info)."""
    return any(row_has(row, key) for key in (*ENV_IMAGE_FIELDS, VIDEO_FIELD))


def measure_env_rows(
    rows: list[tuple[int, dict[str, Any]]], env: str, codec: Any, tokenizer: Any, hosts: Hosts
) -> tuple[list[tuple[ImageInput, ...]], list[tuple[int, int, int]], list[str]]:
    """Like `ascent.doctor.images._measure` for environment rows, the resets on `hosts` (the run's: user
    code isolated under `rollout.env_timeout_s`): (the first prompt's images of every usable row; (row
    number, prompt tokens, of them image tokens) per usable row; the problems of the rows the run leaves
    out). Without a tokenizer a row counts its images. Raises EnvResetFailed."""
    names = [row_env(row) or env for _, row in rows]
    envs = HostedEnvs(hosts, names)
    try:
        outs = envs.reset([row for _, row in rows])
    finally:
        envs.close()
    chat = ChatTokens(tokenizer) if tokenizer is not None else None
    shown: list[tuple[ImageInput, ...]] = []
    lengths: list[tuple[int, int, int]] = []
    bad: list[str] = []
    for (row_no, row), name, out in zip(rows, names, outs, strict=True):
        problem = unusable_row(out)
        if problem is not None:
            bad.append(f"row {row_no}: {problem}")
            continue
        if isinstance(out, str):
            raise EnvResetFailed(f"data.train_path row {row_no}: {name}.reset failed ({out})")
        try:
            if chat is not None:
                ids, images = prompt_tokens(chat, codec, Task(name, row, row_no - 1), out)
            else:
                pictures = split_images(out[0])[1]
                ids, images = [], [codec.encode(p, f"row {row_no} image {k}") for k, p in enumerate(pictures)]
        except (EnvResetError, ValueError) as err:  # an image the codec refuses costs the row, as in the run
            bad.append(str(err) if isinstance(err, EnvResetError) else f"row {row_no}: {err}")
            continue
        image = sum(im.num_tokens for im in images)
        shown.append(tuple(images))
        lengths.append((row_no, max(len(ids), image), image))
    return shown, lengths, bad
