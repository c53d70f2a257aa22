"""The reward runner: score a batch of responses, one reward function per row, and never fail silently.

The orchestrator hands it one iteration's responses as `RewardInput`s. Each row uses its own `reward_fn` field
when it has one (resolved once, then cached), else the run's default. An exception, a non-numeric or a
non-finite return costs that sample a 0.0 reward and is logged with its row id; the call's failure count and
rate go into the metrics, and past `max_failure_rate` the whole call raises `RewardFailureError` rather than
train on broken rewards.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ascent.errors import AscentError
from ascent.rewards.registry import RewardConfigError, RewardFn, check_reward_signature, resolve_reward_fn

if TYPE_CHECKING:
    from ascent.config.schema import RewardConfig

MAX_LOGGED_FAILURES = 5


class RewardFailureError(AscentError, RuntimeError):
    """Too many reward calls of one batch failed; the message names the count, the rate, the first error, the fix."""


@dataclass
class RewardInput:
    """One response to score. `metadata` is the dataset row's fields (without the prompt)."""

    prompt: str
    response: str
    response_ids: list[int]
    metadata: dict[str, Any] = field(default_factory=dict)
    row_id: int = 0


@dataclass
class RewardResult:
    """Per-sample rewards and extra components (aligned with the inputs) plus batch metrics."""

    rewards: list[float]
    components: list[dict[str, float]]
    metrics: dict[str, float]


def to_reward(value: Any) -> tuple[float, dict[str, float]]:
    """A reward function's return (a number, or a dict with "reward" and extra components) -> (reward, components).

    Raises TypeError / ValueError for anything else, and for non-finite numbers.
    """
    if isinstance(value, dict):
        if "reward" not in value:
            raise TypeError(f"returned a dict without a 'reward' key (keys: {sorted(value)})")
        extras = {str(k): _finite(v, f"component {k!r}") for k, v in value.items() if k != "reward"}
        return _finite(value["reward"], "reward"), extras
    return _finite(value, "reward"), {}


def _finite(value: Any, what: str) -> float:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"{what} is a {type(value).__name__} ({value!r:.60}), not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} is {number}, not a finite number")
    return number


def _name(fn: RewardFn) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


class RewardRunner:
    """Scores RewardInputs with `default_fn` (a name, import path or callable) or each row's `reward_fn`."""

    def __init__(
        self,
        default_fn: str | RewardFn,
        *,
        kwargs: dict[str, Any] | None = None,
        max_failure_rate: float = 0.05,
        logger: logging.Logger | None = None,
    ):
        if not 0.0 <= max_failure_rate <= 1.0:
            raise RewardConfigError(
                f"reward.max_failure_rate={max_failure_rate}: use a share between 0 and 1."
            )
        self.kwargs = dict(kwargs or {})
        self.max_failure_rate = max_failure_rate
        self.logger = logger or logging.getLogger(__name__)
        self._fns: dict[str, RewardFn] = {}
        if callable(default_fn):
            check_reward_signature(default_fn, self.kwargs, f"reward function {_name(default_fn)}")
            self.default_fn = default_fn
        else:
            self.default_fn = self.resolve(default_fn, "reward.fn")

    @classmethod
    def from_config(cls, reward: RewardConfig, logger: logging.Logger | None = None) -> RewardRunner:
        """Build from the `reward` config section."""
        return cls(reward.fn, kwargs=reward.kwargs, max_failure_rate=reward.max_failure_rate, logger=logger)

    def resolve(self, spec: str, field: str = "reward_fn") -> RewardFn:
        """Resolve and signature-check `spec` once; later calls hit the cache."""
        if spec not in self._fns:
            fn = resolve_reward_fn(spec, field)
            check_reward_signature(fn, self.kwargs, f"{field}={spec}")
            self._fns[spec] = fn
        return self._fns[spec]

    def prepare(self, metadatas: Iterable[dict[str, Any]]) -> None:
        """Resolve every row-level `reward_fn` up front, so a bad one fails at start-up, not mid-run."""
        for index, metadata in enumerate(metadatas):
            if metadata.get("reward_fn"):
                self.resolve(metadata["reward_fn"], f"row {index + 1} reward_fn")

    def fn_for(self, item: RewardInput) -> RewardFn:
        spec = item.metadata.get("reward_fn")
        return self.resolve(spec, f"row_id {item.row_id} reward_fn") if spec else self.default_fn

    def score(self, items: list[RewardInput]) -> RewardResult:
        """Score every item; raise RewardFailureError if the failure share exceeds max_failure_rate."""
        rewards: list[float] = []
        components: list[dict[str, float]] = []
        failures: list[tuple[RewardInput, BaseException]] = []
        for item in items:
            fn = self.fn_for(item)
            try:
                value = fn(item.prompt, item.response, item.response_ids, item.metadata, **self.kwargs)
                reward, extras = to_reward(value)
            except Exception as err:
                failures.append((item, err))
                self._log_failure(fn, item, err, len(failures))
                reward, extras = 0.0, {}
            rewards.append(reward)
            components.append(extras)
        metrics = self._metrics(rewards, components, len(failures))
        self._check_failure_rate(failures, len(items))
        return RewardResult(rewards=rewards, components=components, metrics=metrics)

    def _log_failure(self, fn: RewardFn, item: RewardInput, err: BaseException, count: int) -> None:
        if count <= MAX_LOGGED_FAILURES:
            self.logger.warning(
                "reward function %s failed on row_id %s: %s: %s",
                _name(fn),
                item.row_id,
                type(err).__name__,
                err,
            )
        elif count == MAX_LOGGED_FAILURES + 1:
            self.logger.warning("more reward failures in this batch; see reward/failures in the metrics")

    @staticmethod
    def _metrics(rewards: list[float], components: list[dict[str, float]], failures: int) -> dict[str, float]:
        n = len(rewards)
        metrics = {
            "reward/mean": statistics.fmean(rewards) if n else 0.0,
            "reward/std": statistics.pstdev(rewards) if n else 0.0,
            "reward/failures": float(failures),
            "reward/failure_rate": failures / n if n else 0.0,
        }
        names = sorted({name for extras in components for name in extras})
        for name in names:
            values = [extras[name] for extras in components if name in extras]
            key = f"reward/{name}" if f"reward/{name}" not in metrics else f"reward/component_{name}"
            metrics[key] = statistics.fmean(values)
        return metrics

    def _check_failure_rate(self, failures: list[tuple[RewardInput, BaseException]], total: int) -> None:
        if not failures or len(failures) / total <= self.max_failure_rate:
            return
        item, err = failures[0]
        raise RewardFailureError(
            f"{len(failures)} of {total} reward calls failed ({len(failures) / total:.1%}, over "
            f"reward.max_failure_rate={self.max_failure_rate}); first error on row_id {item.row_id}: "
            f"{type(err).__name__}: {err}. Fix the reward function or raise reward.max_failure_rate."
        ) from err
