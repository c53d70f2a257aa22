"""`ascent debug env`: watch an environment's episodes turn by turn before a long run.

Runs the first N rows of a dataset through an environment with a checkpoint on the reference engine, inline
(in this process, so `breakpoint()` in environment code works), prints every episode turn by turn (model
turns, the environment's answers, the per-turn rewards, how it ended, the token counts with loss mask 1 and
0), and writes the episodes to a JSONL file with their token ids and masks. The environment is `--env`, or
a row's own `env` column when it has one.

For simulators (`ascent.envs.sim`): `random_actions` plays uniformly random action words instead of the
model's turns (the checkpoint gives only the tokenizer), and `frames` writes each episode's rendered frames
(rows with `render: true`) as an image strip `row<i>.png` and a GIF `row<i>.gif` in that folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ascent.data import load_rows
from ascent.envs import ChatTokens, Task, make_env, run_episodes
from ascent.envs.rows import row_env
from ascent.envs.sim.frames import save_gif, save_strip
from ascent.errors import AscentError
from ascent.messages import Episode, Generation, GenerationRequest, SamplingParams
from ascent.models.loading import load_tokenizer, resolve_device
from ascent.orchestrator.episodes import env_image_encoder
from ascent.rollout import build_engine


def run_debug_env(
    model: str,
    data: str,
    env: str | None,
    episodes: int = 4,
    max_turns: int = 4,
    max_tokens: int = 256,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    out: str | None = None,
    device: str = "cpu",
    seed: int = 0,
    random_actions: bool = False,
    frames: str | None = None,
) -> list[Episode]:
    """Run and print `episodes` episodes (one per row, from the first); returns them."""

    rows = load_rows(data)[:episodes]
    if any(env is None and row_env(r) is None for r in rows):
        raise AscentError(f"--env is not set and a row of {data} has no `env` column: name the environment.")
    tok = load_tokenizer(model, field="--model")
    chat = ChatTokens(tok)
    tasks = [
        Task(make_env(str(row_env(r) or env), "--env" if row_env(r) is None else f"row {i} env"), r, row_id=i)
        for i, r in enumerate(rows)
    ]
    if random_actions:
        generate = random_policy(tasks, tok, seed)
    else:
        engine: Any = build_engine(
            "reference",
            model_path=model,
            device=resolve_device(device),
            eos_token_ids=[tok.eos_token_id],
            pad_token_id=tok.pad_token_id,
        )
        generate = engine.generate
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    images = env_image_encoder(model)  # environments that show images need a vision-language model's codec
    result = run_episodes(
        tasks, generate, chat, params, max_turns=max_turns, max_tokens=max_tokens, images=images
    )
    if frames:
        for path in save_frames(tasks, Path(frames)):
            print(f"frames written to {path}")
    for ep in result:
        print(describe(ep, chat.decode))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            f.writelines(json.dumps(record(ep, chat.decode)) + "\n" for ep in result)
    return result


def random_policy(tasks: list[Task], tok: Any, seed: int) -> Any:
    """A `generate` that answers each turn with a random action of the episode's simulator (its words and
    EOS, logprob 0): request_id is the episode's index in `tasks`."""
    import numpy as np  # deferred: only for random actions

    rng = np.random.default_rng(seed)

    def generate(requests: list[GenerationRequest]) -> list[list[Generation]]:
        out = []
        for r in requests:
            actions = getattr(tasks[r.request_id].env, "actions", None)
            if actions is None:
                raise AscentError("--random-actions plays simulators only (`gym` rows: ascent.envs.sim)")
            ids = [*tok.encode(actions.random_text(rng), add_special_tokens=False), tok.eos_token_id]
            out.append([Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")])
        return out

    return generate


def save_frames(tasks: list[Task], folder: Path) -> list[Path]:
    """Each episode's frames (an environment's `frames`) as `row<i>.png` (a strip) and `row<i>.gif`."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for t in tasks:
        shots = getattr(t.env, "frames", None)
        if shots:
            written.append(save_strip(shots, folder / f"row{t.row_id}.png"))
            written.append(save_gif(shots, folder / f"row{t.row_id}.gif"))
    if not written:
        print("no frames: the environment rendered none (simulator rows need `render: true`)")
    return written


def segments(ep: Episode) -> list[tuple[int, list[int]]]:
    """The response as runs of equal loss mask: [(mask, ids), ...] (1: a model turn, 0: an observation)."""
    out: list[tuple[int, list[int]]] = []
    for token, m in zip(ep.response_ids, ep.loss_mask, strict=True):
        if out and out[-1][0] == m:
            out[-1][1].append(token)
        else:
            out.append((m, [token]))
    return out


def describe(ep: Episode, decode: Any) -> str:
    """An episode as text, turn by turn."""
    rewards = ep.metadata.get("turn_rewards", [])
    lines = [
        f"=== row {ep.row_id}: {ep.metadata.get('turns', 0)} turns, reward {ep.reward:g}, "
        f"finish {ep.finish_reason}, {sum(ep.loss_mask)} model / "
        f"{len(ep.loss_mask) - sum(ep.loss_mask)} observation tokens"
    ]
    lines.append(f"[prompt] {decode(ep.prompt_ids)!r}")
    turn = 0
    for mask, ids in segments(ep):
        if mask:
            reward = f"  (reward {rewards[turn]:g})" if turn < len(rewards) else ""
            lines.append(f"[model {turn + 1}] {decode(ids)!r}{reward}")
            turn += 1
        else:
            lines.append(f"[env] {decode(ids)!r}")
    if "env_error" in ep.metadata:
        lines.append(f"[env error] {ep.metadata['env_error']}")
    return "\n".join(lines)


def record(ep: Episode, decode: Any) -> dict[str, Any]:
    """One JSONL line: the episode's ids, masks, per-turn text and rewards (what training would see)."""
    return {
        "row_id": ep.row_id,
        "reward": ep.reward,
        "turn_rewards": ep.metadata.get("turn_rewards", []),
        "finish": ep.finish_reason,
        "prompt_ids": ep.prompt_ids,
        "response_ids": ep.response_ids,
        "loss_mask": ep.loss_mask,
        "sampler_logprobs": ep.sampler_logprobs,
        "segments": [{"mask": m, "text": decode(ids)} for m, ids in segments(ep)],
        **({"env_error": ep.metadata["env_error"]} if "env_error" in ep.metadata else {}),
    }
