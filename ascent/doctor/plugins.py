"""Doctor check: the config's plug-ins resolve (`reward.fn` and the `algorithm.*` names or import paths), as
`ascent train` resolves them at start-up, so a typo in an import path fails the doctor, not the queued job.
"""

from __future__ import annotations

from ascent.config.errors import ConfigError
from ascent.config.schema import RunConfig
from ascent.config.sources import PromptSourceConfig
from ascent.doctor.report import CheckResult, fail, ok
from ascent.rewards.registry import RewardConfigError, check_reward_signature, resolve_reward_fn

NAME = "plug-ins"


def check_plugins(cfg: RunConfig) -> CheckResult:
    from ascent.orchestrator.preflight import check_plugins as check_algorithm  # deferred: imports torch

    problems: list[str] = []
    try:
        check_algorithm(cfg.algorithm)
    except ConfigError as err:
        problems += err.problems
    checked = "algorithm.*"
    if isinstance(cfg.rollout.source, PromptSourceConfig):  # other sources score their own episodes
        checked = "reward.fn and algorithm.*"
        try:
            fn = resolve_reward_fn(cfg.reward.fn)
            check_reward_signature(fn, dict(cfg.reward.kwargs), f"reward.fn={cfg.reward.fn!r}")
        except RewardConfigError as err:
            problems.append(str(err))
    if problems:
        return fail(NAME, " ".join(problems), "fix the import path or the module, as the error says")
    return ok(NAME, f"{checked} resolve")
