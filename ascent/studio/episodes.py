"""The studio's episode browser: a run's experience store as JSON, one episode token by token.

Reads `<run_dir>/experience.db` through its read API (`ascent.transport.store.open_store`, read-only, so it
works while the run writes). Token text comes from the run's tokenizer (`meta.tokenizer`), loaded with the
`tokenizers` library from its `tokenizer.json` (no torch, no transformers); when that file is gone the
browser still shows ids, masks and logprobs.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ascent.transport.store import EpisodeRecord, labelled_segments, open_store

DEFAULT_LIMIT = 200
PREVIEW_CHARS = 160
SUMMARY_FIELDS = ("id", "iteration", "group_index", "row_id", "env", "status", "drop_reason", "reward",
                  "advantage", "turns", "finish_reason", "response_len", "staleness")  # fmt: skip


def list_episodes(run_dir: Path, filters: dict[str, Any], limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """{total, matching, episodes: [summary rows], iterations, envs, statuses} for the filters given
    (iteration, min_reward, max_reward, env, status incl. "dropped"; None means any)."""
    used = {k: v for k, v in filters.items() if v is not None}
    with open_store(run_dir) as store:
        rows = [_summary(r) for r in store.iter_episodes(limit, **used)]
        return {
            "total": store.count(),
            "matching": store.count(**used),
            "episodes": rows,
            "iterations": store.distinct("iteration"),
            "envs": [e for e in store.distinct("env") if e is not None],
            "statuses": store.distinct("status"),
        }


def _summary(r: EpisodeRecord) -> dict[str, Any]:
    row = {name: getattr(r, name) for name in SUMMARY_FIELDS}
    text = r.response_text.replace("\n", "⏎")
    row["preview"] = text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
    return row


def episode_detail(run_dir: Path, episode_id: int) -> dict[str, Any]:
    """One episode: its summary and rewards, the prompt, then each segment (model turn or observation) with
    every token's id, text, loss mask, sampler logprob and policy version."""
    with open_store(run_dir) as store:
        r = store.episode(episode_id)
        decode = token_decoder(store.meta.get("tokenizer") or "")
    detail = _summary(r) | {
        "reward_components": r.reward_components, "turn_rewards": r.turn_rewards,
        "policy_version": r.policy_version, "trainer_version": r.trainer_version,
        "prompt_len": r.prompt_len, "prompt_text": r.prompt_text, "response_text": r.response_text,
        "metadata": r.metadata, "tokens_decoded": decode is not None, "trained_tokens": sum(r.loss_mask),
    }  # fmt: skip
    prompt = [{"id": t, "text": _text(decode, t), "mask": 0} for t in r.prompt_ids]
    segments = [{"label": "prompt", "mask": 0, "text": r.prompt_text, "tokens": prompt}]
    for label, seg in labelled_segments(r):
        tokens = [
            {"id": r.response_ids[i], "text": _text(decode, r.response_ids[i]), "mask": r.loss_mask[i],
             "logprob": r.sampler_logprobs[i], "version": r.token_versions[i]}
            for i in range(seg["start"], seg["end"])
        ]  # fmt: skip
        segments.append({"label": label, "mask": seg["mask"], "text": seg["text"], "tokens": tokens})
    detail["segments"] = segments
    return detail


def _text(decode: Any, token_id: int) -> str | None:
    return decode(token_id) if decode is not None else None


@functools.lru_cache(maxsize=8)
def token_decoder(tokenizer_dir: str) -> Any:
    """id -> text with the tokenizer in `tokenizer_dir` (its tokenizer.json), or None when it does not load."""
    file = Path(tokenizer_dir) / "tokenizer.json"
    if not tokenizer_dir or not file.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(file))
    except Exception:  # a damaged or foreign file: the ids still show
        return None
    return functools.lru_cache(maxsize=65536)(lambda tid: tokenizer.decode([tid], skip_special_tokens=False))
