"""The studio's episode browser: a run's experience store as JSON, one episode token by token.

Reads `<run_dir>/experience.db` with the store's own reader, `ascent.tracking.experience_store` (read-only,
so it works while the run writes). The list is newest first and paged on the server (`offset`, `limit`): a run of a million episodes
sends one page. Token text comes from the run's tokenizer (`meta.tokenizer`), loaded with the `tokenizers`
library from its `tokenizer.json` (no torch, no transformers); when that file is gone the browser still
shows ids, masks and logprobs. A run without a store (an SFT run, or `tracking.experience_store=false`)
answers an empty list and a `missing` sentence saying why.

Simulator episodes that rendered (`ascent.envs.sim`: rows with `render`/`image_obs`) list their frames' files
in `metadata["frames"]`, relative to `<run_dir>/frames/` (FRAMES, next to the store): `sim_steps` pairs each
frame with the action the model took on it (its turn's text) and that turn's reward, and `frame_path` finds
a frame's file for the app's `/api/frame`, refusing any path that leaves the folder.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from ascent.tracking.experience_store import (
    FILE_NAME,
    SUMMARY_COLUMNS,
    EpisodeRecord,
    labelled_segments,
    open_store,
)

FRAMES = "frames"  # <run_dir>/frames: the simulator frames episodes reference
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
PREVIEW_CHARS = 160
PROMPT_PREVIEW_CHARS = 90
SPECIAL_MARKER = re.compile(r"<\|[^|<>\s]{1,40}\|>")  # <|im_start|>, <|eot_id|>, ...
SUMMARY_FIELDS = tuple(c for c in SUMMARY_COLUMNS if c not in ("prompt_text", "response_text"))


def list_episodes(
    run_dir: Path,
    filters: dict[str, Any],
    offset: int = 0,
    limit: int = DEFAULT_LIMIT,
    kind: str | None = None,
) -> dict[str, Any]:
    """{total, matching, offset, limit, episodes: [summary rows, newest first], iterations, envs, statuses,
    missing} for the filters given (iteration, min_reward, max_reward, env, status incl. "dropped", search;
    None means any). `missing` is None, or why the run has no episodes to show."""
    used = {k: v for k, v in filters.items() if v is not None}
    offset, limit = max(0, offset), max(1, min(limit, MAX_LIMIT))
    if not (run_dir / FILE_NAME).is_file():
        return {
            "total": 0,
            "matching": 0,
            "offset": offset,
            "limit": limit,
            "episodes": [],
            "iterations": [],
            "envs": [],
            "statuses": [],
            "missing": no_store_reason(kind),
        }
    with open_store(run_dir) as store:
        return {
            "total": store.count(),
            "matching": store.count(**used),
            "offset": offset,
            "limit": limit,
            "episodes": [_summary(r) for r in store.summaries(offset, limit, **used)],
            "iterations": store.distinct("iteration"),
            "envs": [e for e in store.distinct("env") if e is not None],
            "statuses": store.distinct("status"),
            "missing": None,
        }


def no_store_reason(kind: str | None) -> str:
    if kind == "sft":
        return "SFT runs record no episodes: `ascent sft` trains on the dataset's responses, it samples none."
    return (
        "This run has no experience store (experience.db): it ran with tracking.experience_store=false, "
        "or has not recorded an episode yet."
    )


def _preview(text: str, chars: int) -> str:
    """One line of at most `chars` characters: the start of `text`, newlines shown as ⏎."""
    text = " ".join(text.replace("\n", " ⏎ ").split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


def prompt_preview(text: str, chars: int = PROMPT_PREVIEW_CHARS) -> str:
    """The prompt in one line of at most `chars` characters, chat-template markers (`<|im_start|>`) dropped
    and, when it is longer, its end: a chat prompt's system text comes first, the question last."""
    text = " ".join(SPECIAL_MARKER.sub(" ", text).replace("\n", " ⏎ ").split()).strip(" ⏎")
    return text if len(text) <= chars else "…" + text[-(chars - 1) :]


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    row = {name: r[name] for name in SUMMARY_FIELDS}
    row["prompt"] = prompt_preview(r["prompt_text"])
    row["preview"] = _preview(r["response_text"], PREVIEW_CHARS)
    return row


def episode_detail(run_dir: Path, episode_id: int) -> dict[str, Any]:
    """One episode: its summary and rewards, the prompt, then each segment (model turn or observation) with
    every token's id, text, loss mask, sampler logprob and policy version."""
    with open_store(run_dir) as store:
        r = store.episode(episode_id)
        decode = token_decoder(store.meta.get("tokenizer") or "")
    detail = _summary(r.to_dict()) | {
        "reward_components": r.reward_components,
        "turn_rewards": r.turn_rewards,
        "policy_version": r.policy_version,
        "trainer_version": r.trainer_version,
        "prompt_len": r.prompt_len,
        "prompt_text": r.prompt_text,
        "response_text": r.response_text,
        "metadata": r.metadata,
        "tokens_decoded": decode is not None,
        "trained_tokens": sum(r.loss_mask),
    }
    prompt = [{"id": t, "text": _text(decode, t), "mask": 0} for t in r.prompt_ids]
    segments = [{"label": "prompt", "mask": 0, "text": r.prompt_text, "tokens": prompt}]
    segments += [
        {"label": label, "mask": seg["mask"], "text": seg["text"], "tokens": _tokens(r, seg, decode)}
        for label, seg in labelled_segments(r)
    ]
    detail["segments"] = segments
    detail["steps"] = sim_steps(r)
    return detail


def sim_steps(r: EpisodeRecord) -> list[dict[str, Any]]:
    """[{step, frame, action, reward}]: frame k (the state before step k + 1, a path under FRAMES) beside the
    action of model turn k + 1 and its reward; the last frame (after the last step) has neither. Empty for an
    episode without frames."""
    frames = r.metadata.get("frames")
    if not isinstance(frames, list) or not frames:
        return []
    actions = [seg["text"] for label, seg in labelled_segments(r) if label.startswith("model turn")]
    return [
        {
            "step": k,
            "frame": str(frame),
            "action": actions[k] if k < len(actions) else None,
            "reward": r.turn_rewards[k] if k < len(r.turn_rewards) else None,
        }
        for k, frame in enumerate(frames)
    ]


def frame_path(run_dir: Path, path: str) -> Path:
    """The file of frame `path` (relative to `<run_dir>/frames`); FileNotFoundError when it is not a PNG in
    that folder (a path that climbs out of it included)."""
    root = (run_dir / FRAMES).resolve()
    file = (root / path).resolve()
    if file.suffix != ".png" or not file.is_relative_to(root) or not file.is_file():
        raise FileNotFoundError(f"no frame {path!r} in {root}")
    return file


def _tokens(r: EpisodeRecord, seg: dict[str, Any], decode: Any) -> list[dict[str, Any]]:
    """Each response token of the segment: id, text, loss mask, sampler logprob, policy version."""
    return [
        {
            "id": r.response_ids[i],
            "text": _text(decode, r.response_ids[i]),
            "mask": r.loss_mask[i],
            "logprob": r.sampler_logprobs[i],
            "version": r.token_versions[i],
        }
        for i in range(seg["start"], seg["end"])
    ]


def _text(decode: Any, token_id: int) -> str | None:
    return decode(token_id) if decode is not None else None


@functools.lru_cache(maxsize=8)
def token_decoder(tokenizer_dir: str) -> Any:
    """id -> text with the tokenizer in `tokenizer_dir` (its tokenizer.json), or None when it does not
    load."""
    file = Path(tokenizer_dir) / "tokenizer.json"
    if not tokenizer_dir or not file.is_file():
        return None
    try:
        from tokenizers import Tokenizer  # deferred: tokenizers, only when a tokenizer is built or read

        tokenizer = Tokenizer.from_file(str(file))
    except Exception:  # a damaged or foreign file: the ids still show
        return None
    return functools.lru_cache(maxsize=65536)(lambda tid: tokenizer.decode([tid], skip_special_tokens=False))
