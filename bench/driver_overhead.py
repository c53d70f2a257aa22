r"""The controller's own Python per GRPO iteration, stage by stage, on synthetic episodes (CPU only).

    python bench/driver_overhead.py --episodes 512 --tokens 512 --reps 5

With several GPUs the controller's work between the trainer's calls is on every iteration's critical path:
at 4 GPUs an iteration is ~3.5 s, and the driver's stages (building episodes, metrics, advantages, the
samples' targets, the experience records) add up to a tenth of a second or more. This times each stage of
`ascent.orchestrator.loop.run_iteration` that runs on the controller, on `--episodes` episodes of
`--tokens` response tokens (groups of 8, half of them with a mid-generation weight swap), with the functions
the loop calls; the responses are decoded by the project's tiny character tokenizer (a real BPE vocabulary
decodes slower per token). Median milliseconds per stage over `--reps` runs, after one warm-up.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from ascent.config.schema import RunConfig
from ascent.messages import Generation, Group, flatten
from ascent.models.tiny import make_char_tokenizer
from ascent.orchestrator import batch as B
from ascent.orchestrator import collector as C
from ascent.orchestrator import experience
from ascent.orchestrator import loop as L


def generations(n: int, tokens: int, seed: int = 0) -> list[Generation]:
    """`n` generations of `tokens` tokens; every other one had a publication land mid-way."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        cut = rng.randrange(1, tokens) if i % 2 else tokens
        out.append(
            Generation(
                token_ids=[rng.randrange(150_000) for _ in range(tokens)],
                logprobs=[-rng.random() * 3 for _ in range(tokens)],
                finish_reason="length",
                token_versions=[3] * cut + [4] * (tokens - cut),
            )
        )
    return out


def stages(args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    """The controller's stages of one iteration, each a closure over the previous stage's output."""
    items = [
        C._Item([random.randrange(150_000) for _ in range(256)], r, {}) for r in range(args.episodes // 8)
    ]
    gens = generations(args.episodes, args.tokens)
    per_item = [gens[i * 8 : (i + 1) * 8] for i in range(len(items))]
    advantage = B.advantage_of(RunConfig.model_validate({"model": {"path": "m"}}).algorithm)
    state: dict[str, Any] = {}
    log = args.log
    decoder = B.TextDecoder(args.tokenizer)  # the run's decoder, over the tiny tokenizer's ids
    texts = [[t % len(args.tokenizer) for t in g.token_ids] for g in gens]

    def to_groups() -> None:
        state["groups"] = B.to_groups(items, per_item, decode=lambda ids: "", policy_version=3)

    def scored() -> None:  # what the reward phase hands on (scoring itself is the reward fn's time)
        rng = random.Random(1)
        groups = [
            Group(tuple(replace(e, reward=float(rng.random() < 0.5)) for e in g.episodes))
            for g in state["groups"]
        ]
        state["groups"], state["episodes"] = groups, flatten(groups)

    def advantages() -> None:
        samples = B.train_samples(state["episodes"])
        adv, returns = B.compute_advantages(state["groups"], advantage)
        samples = B.with_targets(samples, adv, None, None, returns=returns, values=None)
        samples, _ = B.filter_zero_advantage(samples)
        experience.record_trained(log, 5, state["groups"], samples)
        state["samples"] = samples

    return {
        "(decode responses, one call each: before)": lambda: [decoder(s) for s in texts],
        "decode responses (TextDecoder.many)": lambda: decoder.many(texts),
        "to_groups (episodes from generations)": to_groups,
        "(setup: rewards; not counted)": scored,
        "staleness_metrics": lambda: C.staleness_metrics(state["episodes"], trainer_version=4),
        "train_samples": lambda: B.train_samples(state["episodes"]),
        "compute_advantages": lambda: B.compute_advantages(state["groups"], advantage),
        "advantages phase (samples, advantages, targets, filter)": advantages,
        "rollout_metrics (with swaps)": lambda: L.rollout_metrics(state["episodes"]),
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-store", action="store_true", help="tracking.experience_store=false")
    args = ap.parse_args(argv)
    print(f"{args.episodes} episodes x {args.tokens} response tokens, median of {args.reps}")
    with tempfile.TemporaryDirectory() as tmp:
        path = None if args.no_store else str(Path(tmp) / "experience.db")
        spec = experience.ExperienceSpec(path=path, tokenizer="synthetic")
        make_char_tokenizer(tmp)
        args.tokenizer = AutoTokenizer.from_pretrained(tmp)
        with experience.recording(spec, _Tokenizer(), 0) as args.log:
            run_stages(args)


class _Tokenizer:
    """The store's decoder: a fixed string per id, as cheap as a tokenizer gets."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids[:8]))


def run_stages(args: argparse.Namespace) -> None:
    total = 0.0
    for name, fn in stages(args).items():
        fn()  # warm-up; also builds the state the next stages read
        times = []
        for _ in range(args.reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        ms = 1e3 * statistics.median(times)
        total += ms if not name.startswith(("train_samples", "compute_advantages", "(")) else 0.0
        print(f"{name:<58} {ms:8.1f} ms")
    print(f"{'on the critical path (decode, to_groups, staleness, advantages, metrics)':<58} {total:8.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
