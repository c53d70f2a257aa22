"""Evaluation metrics over k samples per prompt: pass@k, mean@k, and the same per `data_source` and per
environment, plus the means of the numbers rewards and environments return (reward components, turns, tool
calls).

Validation inside `ascent train` (`ascent.orchestrator.validation`) and `ascent eval`
(`ascent.entrypoints.evaluate`) both reduce their scored episodes with `eval_metrics`; the keys it returns
(`pass@4`, `source/gsm8k/mean@4`, `env/sql/pass@1`, `reward/format`, `env_info/guesses`) are what the trackers and the studio
chart, under `val/` in training. Pure functions over plain numbers: no torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ascent.messages import Episode

CORRECT_AT = 1.0 - 1e-6  # a response counts as correct when its reward is at least 1 (the 0/1 built-ins)
EPISODE_NUMBERS = ("turns", "tool_calls")  # an episode's metadata numbers its environment reports


@dataclass(frozen=True)
class ScoredSample:
    """One scored sample: the prompt it answers (`prompt`: its row id), its reward, the row's `data_source`
    and environment (None: none named) and the extra numbers to average (reward components, turns, ...)."""

    prompt: int
    reward: float
    data_source: str | None = None
    env: str | None = None
    numbers: dict[str, float] = field(default_factory=dict)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c are correct (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k), as a stable product.

    Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): needs 0 <= c <= n and 1 <= k <= n.")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def check_ks(ks: Sequence[int], samples: int, field_name: str, samples_field: str) -> None:
    """Raise ValueError when some k of `ks` is below 1 or above the samples drawn per prompt."""
    bad = [k for k in ks if not 1 <= k <= samples]
    if bad:
        raise ValueError(
            f"{field_name}={list(ks)}: pass@k and mean@k need 1 <= k <= {samples_field}={samples} samples per "
            f"prompt ({bad} do not fit); raise {samples_field} or drop those k."
        )


def _by_prompt(samples: Iterable[ScoredSample]) -> list[list[ScoredSample]]:
    groups: dict[int, list[ScoredSample]] = defaultdict(list)
    for s in samples:
        groups[s.prompt].append(s)
    return list(groups.values())


def _core(samples: Sequence[ScoredSample], ks: Sequence[int]) -> dict[str, float]:
    """accuracy, reward_mean and, per k, pass@k (the mean over prompts of the unbiased estimate from all n
    samples) and mean@k (the mean over prompts of the mean reward of their first k samples). A prompt with
    fewer than k samples (an episode lost to an error) counts toward neither."""
    n = len(samples)
    out = {
        "accuracy": sum(s.reward >= CORRECT_AT for s in samples) / n,
        "reward_mean": sum(s.reward for s in samples) / n,
    }
    prompts = _by_prompt(samples)
    for k in ks:
        full = [g for g in prompts if len(g) >= k]
        if not full:
            continue
        correct = [sum(s.reward >= CORRECT_AT for s in g) for g in full]
        out[f"pass@{k}"] = sum(pass_at_k(len(g), c, k) for g, c in zip(full, correct, strict=True)) / len(
            full
        )
        out[f"mean@{k}"] = sum(sum(s.reward for s in g[:k]) / k for g in full) / len(full)
    return out


def eval_metrics(samples: Sequence[ScoredSample], ks: Sequence[int] = ()) -> dict[str, float]:
    """Scored samples -> metrics: `_core`'s over all samples; the same under `source/<data_source>/` and
    `env/<env>/` for the rows that name one; the means of the numbers, each over the samples that report it:
    `reward/<component>`, `turns_mean` / `tool_calls_mean`, `env_info/<name>`. Empty when there are no samples."""
    if not samples:
        return {}
    out = _core(samples, ks)
    for prefix, key in (("source", "data_source"), ("env", "env")):
        parts: dict[str, list[ScoredSample]] = defaultdict(list)
        for s in samples:
            if getattr(s, key) is not None:
                parts[str(getattr(s, key))].append(s)
        for name, part in sorted(parts.items()):
            out |= {f"{prefix}/{name}/{m}": v for m, v in _core(part, ks).items()}
    numbers: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        for name, value in s.numbers.items():
            numbers[name].append(float(value))
    for name, values in sorted(numbers.items()):
        if name in EPISODE_NUMBERS:
            label = f"{name}_mean"
        else:
            label = name if name.startswith("env_info/") else f"reward/{name}"
        out[label] = sum(values) / len(values)
    return out


def episode_sample(e: Episode, env: str | None = None) -> ScoredSample:
    """An `Episode` as a ScoredSample: its row's `data_source` and `env` columns (`env`: the run's
    environment when the row names none), reward components, the turns/tool calls its environment counted and
    the numbers its environment's info reported (`metadata["env_info"]`, `ascent.envs.runner`)."""
    meta = e.metadata
    numbers = {k: float(v) for k, v in e.reward_components.items()}
    numbers |= {k: float(meta[k]) for k in EPISODE_NUMBERS if isinstance(meta.get(k), int | float)}
    numbers |= {f"env_info/{k}": float(v) for k, v in (meta.get("env_info") or {}).items()}
    source = meta.get("data_source")
    row_env = meta.get("env") if isinstance(meta.get("env"), str) else None
    return ScoredSample(
        e.row_id, e.reward, str(source) if source is not None else None, row_env or env, numbers
    )
