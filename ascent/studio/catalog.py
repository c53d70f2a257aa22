"""What the studio's plots know about metrics: each one's unit (the y-axis title), the x axis of each kind of
run, which metrics an SFT run's plots leave out, and the SFT throughput derived from the record times.

An SFT run logs the policy trainer's statistics as they come, PPO's included: with no old policy and no
clipping, `approx_kl`, `clipfrac` and `ratio` are constants (0, 0, 1) and `skipped` counts non-finite steps;
the studio shows an SFT run its own charts (loss in nats per token, learning rate, gradient norm, tokens,
tokens/s, seconds per step) and leaves those out. Units are matched on the metric name, first match wins.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

X_TITLES = {"train": "iteration", "sft": "optimizer step"}
SFT_HIDDEN = frozenset({"approx_kl", "clipfrac", "ratio", "loss/total"})
SFT_HIDDEN_PREFIXES = ("reward/", "rollout/", "loss/kl", "kl")
SFT_TOKENS_PER_S = "perf/tokens_per_s"
SFT_STEP_TIME = "time/step"
NATS = "nats/token"
# (metric-name pattern, unit): the first pattern that matches names the y axis
UNITS: tuple[tuple[str, str], ...] = (
    ("*tokens_per_s*", "tokens/s"),
    ("*per_s", "per second"),
    ("time/*", "s"),
    ("*_s", "s"),
    ("sft/nll", NATS),
    ("val/nll", NATS),
    ("entropy", NATS),
    ("*logprob*", "nats"),
    ("*approx_kl*", "nats"),
    ("*kl*", "nats"),
    ("lr", "learning rate"),
    ("grad_norm", "L2 norm"),
    ("*frac*", "fraction"),
    ("*rate", "fraction"),
    ("val/accuracy", "fraction"),
    ("*pass@*", "fraction"),  # validation's pass@k, overall and per data_source / environment
    ("*mean@*", "reward"),
    ("val/*/accuracy", "fraction"),
    ("ratio", "probability ratio"),
    ("*staleness*", "policy versions"),
    ("*_len_*", "tokens"),
    ("*tokens*", "tokens"),
    ("*failures", "episodes"),
    ("*dropped*", "episodes"),
    ("reward/std", "reward"),
    ("reward/*", "reward"),
    ("val/reward*", "reward"),
    ("micro_batches", "micro-batches"),
    ("skipped", "steps skipped"),
    ("*trajectories", "episodes"),
    ("*optimizer_steps", "steps"),
    ("*memory*", "GiB"),
)


def unit_of(metric: str, kind: str | None) -> str:
    """The unit of `metric` for a run of `kind` ("" when unknown). An SFT run's loss is the NLL in nats per
    token; an RL run's `loss/*` is a surrogate objective without a unit."""
    if kind == "sft" and metric.startswith("loss/"):
        return NATS
    return next((unit for pattern, unit in UNITS if fnmatchcase(metric, pattern)), "")


def shown(metric: str, kind: str | None) -> bool:
    """Whether the plots of a run of `kind` show `metric` (an SFT run hides the RL-only statistics)."""
    if kind != "sft":
        return True
    return metric not in SFT_HIDDEN and not metric.startswith(SFT_HIDDEN_PREFIXES)


def with_sft_throughput(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """SFT records plus `time/step` (seconds since the previous record) and `perf/tokens_per_s` (`tokens` over
    that time; the trainer's `tokens` is summed over ranks), unless the run logs them itself. The first record
    has no previous one and gets neither."""
    out, previous = [], None
    for record in records:
        now = record.get("time")
        extra: dict[str, float] = {}
        if isinstance(now, int | float) and isinstance(previous, int | float) and now > previous:
            dt = float(now - previous)
            extra[SFT_STEP_TIME] = dt
            tokens = record.get("tokens")
            if isinstance(tokens, int | float):
                extra[SFT_TOKENS_PER_S] = tokens / dt
        previous = now if isinstance(now, int | float) else previous
        out.append({**extra, **record})
    return out
