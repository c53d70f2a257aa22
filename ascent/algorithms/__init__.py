"""Pure RL math for ascent: advantages, policy losses, loss aggregation, KL, entropy, filters, corrections.

Imports only torch. Every registry is a plain dict (name -> function); `ascent.plugins.resolve(registry, name,
field)` also accepts an import path `pkg.module:function` so users can plug in their own. See
docs/algorithms.md for the table of names and docs/contracts.md for the signatures.
"""

from ascent.algorithms.advantage_types import AdvantageInputs, AdvantageOutputs
from ascent.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    gpg,
    grpo,
    grpo_passk,
    opo,
    passk,
    rloo,
)
from ascent.algorithms.aggregation import LOSS_AGGREGATIONS
from ascent.algorithms.correction import rollout_correction_weights
from ascent.algorithms.cov_losses import clip_cov_loss, kl_cov_loss
from ascent.algorithms.dapo import filter_groups_with_variance, overlong_penalty, truncation_mask
from ascent.algorithms.distill import distill, reverse_kl
from ascent.algorithms.entropy import entropy_from_logits
from ascent.algorithms.filters import length_filter, zero_advantage_filter
from ascent.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty_rewards,
)
from ascent.algorithms.otb import optimal_token_baseline, sum_pi_squared_from_logits
from ascent.algorithms.policy_losses import (
    POLICY_LOSSES,
    cispo_loss,
    dro_loss,
    gmpo_loss,
    gspo_loss,
    ppo_loss,
    reinforce_loss,
    sapo_loss,
)
from ascent.algorithms.registry import option_names, options_for
from ascent.algorithms.returns import gae, reinforce_pp, reinforce_pp_baseline, remax
from ascent.algorithms.value import value_clipfrac, value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageOutputs",
    "FixedKLController",
    "cispo_loss",
    "clip_cov_loss",
    "distill",
    "dro_loss",
    "entropy_from_logits",
    "filter_groups_with_variance",
    "gae",
    "gmpo_loss",
    "gpg",
    "grpo",
    "grpo_passk",
    "gspo_loss",
    "kl_cov_loss",
    "kl_penalty_rewards",
    "length_filter",
    "overlong_penalty",
    "opo",
    "optimal_token_baseline",
    "passk",
    "ppo_loss",
    "reinforce_loss",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "option_names",
    "options_for",
    "reverse_kl",
    "rloo",
    "rollout_correction_weights",
    "sapo_loss",
    "sum_pi_squared_from_logits",
    "truncation_mask",
    "value_clipfrac",
    "value_loss",
    "zero_advantage_filter",
]
