"""The reward runner: score a batch of responses, one reward function per row, and never fail silently.

The orchestrator hands it one iteration's responses as `RewardInput`s. Each row uses its own `reward_fn` field
when it has one, else the run's default. The calls go through an executor (`map(fn, items) -> outcomes`):
the orchestrator injects the run's hosts for reward calls (`ascent.cluster.hosts`: processes with a per-call
timeout for `reward.isolation=process`), so a function that raises, exits, hangs or kills its process costs
that sample; without one they run in this process. A failed call, a non-numeric or a non-finite return costs that
sample a 0.0 reward and is logged with its row (counted from 1, as data errors count them); the call's
failure count and rate go into the metrics, and past `max_failure_rate` the whole call raises
`RewardFailureError` rather than train on broken rewards. The functions are named by spec (built-in name or
import path) and resolved once per process, so worker processes import them themselves.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from ascent.errors import AscentError
from ascent.messages import Outcome
from ascent.rewards.registry import RewardConfigError, RewardFn, check_reward_signature, resolve_reward_fn

MAX_LOGGED_FAILURES = 5


class RewardFailureError(AscentError, RuntimeError):
    """Too many reward calls of one batch failed; the message names the count, the rate, the first error, the
    fix. `failed` of `total` calls failed, the first on row `row` (counted from 1) with `first_error`, for a
    caller whose settings are not `reward.*` (ascent eval) to say it in its own words."""

    def __init__(self, message: str, failed: int, total: int, row: int, first_error: str) -> None:
        super().__init__(message)
        self.failed, self.total, self.row, self.first_error = failed, total, row, first_error


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
    """A reward function's return (a number, or a dict with "reward" and extra components) -> (reward,
    components).

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


def _name(fn: RewardFn | str) -> str:
    if isinstance(fn, str):
        return fn
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


_RESOLVED: dict[str, RewardFn] = {}  # per process: worker processes resolve each spec once


def score_task(
    kwargs: dict[str, Any], task: tuple[str | RewardFn, RewardInput]
) -> tuple[float, dict[str, float]]:
    """One reward call, as the executor runs it (in a worker process or inline): (reward, components)."""
    fn, item = task
    if isinstance(fn, str):
        if fn not in _RESOLVED:
            _RESOLVED[fn] = resolve_reward_fn(fn)
        fn = _RESOLVED[fn]
    return to_reward(fn(item.prompt, item.response, item.response_ids, item.metadata, **kwargs))


class Executor(Protocol):
    """Runs `fn` on every item -> one `Outcome` per item (`ascent.envs.hosts.Hosts` keeps this contract);
    `detail` says what the calls run, for messages while it waits."""

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> Sequence[Outcome]: ...

    def close(self) -> None: ...


class RewardRunner:
    """Scores RewardInputs with `default_fn` (a name, import path or callable) or each row's `reward_fn`.
    `settings` maps a setting that reward errors name (as `ascent train` calls it, e.g.
    `builtin.ANSWER_KEY_SETTING`) to what this caller's user sets instead (`ascent eval`: "--answer-key");
    failures are logged and raised in those words."""

    def __init__(
        self,
        default_fn: str | RewardFn,
        *,
        kwargs: dict[str, Any] | None = None,
        max_failure_rate: float = 0.05,
        logger: logging.Logger | None = None,
        executor: Executor | None = None,
        settings: Mapping[str, str] | None = None,
    ):
        if not 0.0 <= max_failure_rate <= 1.0:
            raise RewardConfigError(
                f"reward.max_failure_rate={max_failure_rate}: use a share between 0 and 1."
            )
        self.kwargs = dict(kwargs or {})
        self.settings = dict(settings or {})
        self.max_failure_rate = max_failure_rate
        self.logger = logger or logging.getLogger(__name__)
        self._fns: dict[str, RewardFn] = {}
        self.executor = executor
        self.default_spec: str | RewardFn
        if callable(default_fn):
            check_reward_signature(default_fn, self.kwargs, f"reward function {_name(default_fn)}")
            self.default_fn = self.default_spec = default_fn
        else:
            self.default_fn = self.resolve(default_fn, "reward.fn")
            self.default_spec = default_fn

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

    def spec_for(self, item: RewardInput) -> str | RewardFn:
        """What a call of `item` needs: the function itself inline, its spec for a worker process (which
        resolves it there); a row's `reward_fn` is checked here first either way."""
        spec = item.metadata.get("reward_fn")
        fn = self.resolve(spec, f"row {item.row_id + 1} reward_fn") if spec else self.default_fn
        if self.executor is None:
            return fn
        return str(spec) if spec else self.default_spec

    def score(self, items: list[RewardInput]) -> RewardResult:
        """Score every item; raise RewardFailureError if the failure share exceeds max_failure_rate."""
        specs = [self.spec_for(item) for item in items]
        executor = self.executor or _INLINE
        names = sorted({_name(spec) for spec in specs})
        detail = f"reward.fn={', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
        outcomes = executor.map(
            partial(score_task, self.kwargs), list(zip(specs, items, strict=True)), detail
        )
        rewards: list[float] = []
        components: list[dict[str, float]] = []
        failures: list[tuple[RewardInput, str]] = []
        for spec, item, outcome in zip(specs, items, outcomes, strict=True):
            reward, extras = outcome.value if outcome.error is None else (0.0, {})
            if outcome.error is not None:
                failures.append((item, self._reword(outcome.error)))
                self._log_failure(spec, item, failures[-1][1], len(failures))
            rewards.append(reward)
            components.append(extras)
        metrics = self._metrics(rewards, components, len(failures))
        self._check_failure_rate(failures, len(items))
        return RewardResult(rewards=rewards, components=components, metrics=metrics)

    def close(self) -> None:
        """Stop the executor's worker processes (the runner still works; they restart on the next score)."""
        if self.executor is not None:
            self.executor.close()

    def _reword(self, error: str) -> str:
        """`error` with each setting it names (a key of `settings`) in this caller's words."""
        for setting, words in self.settings.items():
            error = error.replace(setting, words)
        return error

    def _log_failure(self, fn: RewardFn | str, item: RewardInput, error: str, count: int) -> None:
        if count <= MAX_LOGGED_FAILURES:
            self.logger.warning("reward function %s failed on row %d: %s", _name(fn), item.row_id + 1, error)
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

    def _check_failure_rate(self, failures: list[tuple[RewardInput, str]], total: int) -> None:
        if not failures or len(failures) / total <= self.max_failure_rate:
            return
        item, error = failures[0]
        raise RewardFailureError(
            f"{len(failures)} of {total} reward calls failed ({len(failures) / total:.1%}, over "
            f"reward.max_failure_rate={self.max_failure_rate}); first error on row {item.row_id + 1}: "
            f"{error}. Fix the reward function or raise reward.max_failure_rate.",
            len(failures),
            total,
            item.row_id + 1,
            error,
        )


class _InlineExecutor:
    """Calls in this process, each failure its outcome (what runs without an injected executor)."""

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        return [Outcome.of(fn, item) for item in items]

    def close(self) -> None:
        pass


_INLINE = _InlineExecutor()
