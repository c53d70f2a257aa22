"""Record verl's values for the cases of test_alg_verl_reference.py into cases.json (not run by the suite).

verl is not a dependency of ascent; this script calls its functions, it copies none of them. To re-record:
put a checkout of verl (github.com/volcengine/verl) on PYTHONPATH with omegaconf and tensordict importable,
and run `python tests/unit/algorithms/verl_reference/record.py <verl commit>`. `verl.workers.config` (model
and engine configs, which pull in transformers classes verl's policy losses never touch) is stubbed.

Each case draws its inputs from a seeded generator, calls one verl function in verl's padded layout [B, T]
and stores inputs, settings and results. The test runs ascent's counterpart on the same inputs.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import torch

_stub = types.ModuleType("verl.workers.config")
_stub.ActorConfig = object  # type: ignore[attr-defined]
sys.modules.setdefault("verl.workers", types.ModuleType("verl.workers"))
sys.modules["verl.workers.config"] = _stub
import verl.trainer.ppo.core_algos as C  # noqa: E402
import verl.utils.torch_functional as F  # noqa: E402

OUT = Path(__file__).with_name("cases.json")
B, T, GROUP = 8, 6, 4


class Cfg(dict):
    """verl reads its actor config both as attributes and with .get()."""

    __getattr__ = dict.get


def draw(seed: int, positive: bool = False) -> dict:
    """Seeded inputs: rewards [B] (two groups of 4, each with a spread), a ragged mask [B, T], logprobs."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    if positive:
        rewards = torch.randint(1, 5, (B,), generator=g).float() / 2
    else:
        rewards = torch.randint(0, 2, (B,), generator=g).float()
    rewards[0], rewards[1], rewards[GROUP], rewards[GROUP + 1] = (
        0.0 + positive,
        1.0 + positive,
        1.0 + positive,
        0.0 + positive,
    )
    old = -torch.rand(B, T, generator=g) * 2 - 0.05
    logprobs = old + torch.randn(B, T, generator=g) * 0.3
    advantages = torch.randn(B, T, generator=g)
    values = torch.randn(B, T, generator=g) * mask
    baselines = torch.rand(B, generator=g)
    # drawn last (the draws above keep their values): a sum of squared probabilities in [p^2, 1], p = exp(old)
    p2 = old.exp() ** 2
    sum_pi_squared = p2 + (1 - p2) * torch.rand(B, T, generator=g) * 0.5
    return {
        "rewards": rewards,
        "mask": mask,
        "group_ids": torch.arange(B) // GROUP,
        "old_logprobs": old,
        "logprobs": logprobs,
        "advantages": advantages,
        "values": values,
        "baselines": baselines,
        "sum_pi_squared": sum_pi_squared,
    }


def token_rewards(x: dict) -> torch.Tensor:
    out = torch.zeros_like(x["mask"])
    last = x["mask"].sum(-1).long() - 1
    out[torch.arange(B), last] = x["rewards"]
    return out


def advantage_case(
    name: str, seed: int, opts: dict, verl_call, positive: bool = False, verl: str | None = None
) -> dict:
    x = draw(seed, positive)
    adv, returns = verl_call(x)
    out = {"advantages": adv} if returns is None else {"advantages": adv, "returns": returns * x["mask"]}
    extra = {} if verl is None else {"verl": verl}
    return case("advantage", name, seed, opts, x, out, positive=positive, **extra)


def loss_case(name: str, seed: int, opts: dict, agg: str, verl_loss, verl_cfg: Cfg) -> dict:
    x = draw(seed)
    logprobs = x["logprobs"].clone().requires_grad_(True)
    fn = C.get_policy_loss_fn(verl_loss)
    cfg = Cfg(verl_cfg, global_batch_info={})
    loss, _ = fn(x["old_logprobs"], logprobs, x["advantages"], x["mask"], agg, cfg)
    loss.backward()
    out = {"loss": loss.detach(), "grad": logprobs.grad}
    return case("policy_loss", name, seed, opts, x, out, aggregation=agg, verl=verl_loss)


DRAWS: dict[str, dict] = {}


def listed(t: torch.Tensor) -> list | float:
    """A float32 tensor as nested lists of 9-digit floats (enough to give the same float32 back)."""
    return np.vectorize(lambda v: float(f"{v:.9g}"), otypes=[object])(t.detach().double().numpy()).tolist()


def case(kind: str, name: str, seed: int, opts: dict, x: dict, out: dict, positive=False, **extra) -> dict:
    key = f"{seed}{'+' if positive else ''}"
    DRAWS[key] = {k: listed(v) for k, v in x.items()}
    return {
        "kind": kind,
        "name": name,
        "draw": key,
        "opts": opts,
        "expected": {k: listed(v) for k, v in out.items()},
        **extra,
    }


def index(x: dict) -> np.ndarray:
    return x["group_ids"].numpy()


def outcome(fn, **kw):
    """verl's outcome estimator `fn` on a draw (rewards on each row's last token, the group index)."""

    def call(x: dict):
        return fn(token_rewards(x), x["mask"], index(x), **kw)

    return call


def whiten(shift: bool):
    def call(x: dict):
        return F.masked_whiten(x["advantages"], x["mask"], shift_mean=shift) * x["mask"], None

    return call


def token_level(name: str, gamma: float):
    def call(x: dict):
        if name == "gae":
            return C.compute_gae_advantage_return(token_rewards(x), x["values"], x["mask"], gamma, 0.95)
        if name == "remax":
            return C.compute_remax_outcome_advantage(token_rewards(x), x["baselines"], x["mask"])[0], None
        return C.compute_reinforce_plus_plus_outcome_advantage(token_rewards(x), x["mask"], Cfg(gamma=gamma))

    return call


def advantage_cases() -> list[dict]:
    out = []
    for seed in range(4):
        for scale in (True, False):
            passk = outcome(C.compute_grpo_passk_outcome_advantage, config={"norm_adv_by_std_in_grpo": scale})
            out.append(advantage_case("grpo_passk", seed, {"scale_by_std": scale}, passk))
            grpo = outcome(C.compute_grpo_outcome_advantage, norm_adv_by_std_in_grpo=scale)
            out.append(advantage_case("grpo", seed, {"scale_by_std": scale}, grpo))
        gpg = outcome(C.compute_gpg_outcome_advantage)
        out.append(advantage_case("gpg", seed, {"gpg_alpha": True}, gpg, positive=True))
        out.append(advantage_case("rloo", seed, {}, outcome(C.compute_rloo_outcome_advantage)))
        out.append(advantage_case("opo", seed, {}, outcome(C.compute_opo_outcome_advantage)))
        # verl's reinforce_pp_baseline returns its whitened advantages as returns, ascent the unwhitened ones.
        baseline = outcome(C.compute_reinforce_plus_plus_baseline_outcome_advantage)
        out.append(advantage_case("reinforce_pp_baseline", seed, {}, lambda x, f=baseline: (f(x)[0], None)))
        for shift in (True, False):
            out.append(advantage_case("masked_whiten", seed, {"shift_mean": shift}, whiten(shift)))
        for gamma in (1.0, 0.9):
            out.append(
                advantage_case("reinforce_pp", seed, {"gamma": gamma}, token_level("reinforce_pp", gamma))
            )
            gae = {"gamma": gamma, "lam": 0.95}
            out.append(advantage_case("gae", seed, gae, token_level("gae", gamma)))
        out.append(advantage_case("remax", seed, {}, token_level("remax", 1.0)))
    return out


def otb(fn, zero_tail: bool):
    """verl's optimal-token baseline `fn` on a draw: the draw's old logprobs and sum of squared probabilities."""

    def call(x: dict):
        return fn(
            token_rewards(x),
            x["mask"],
            index(x),
            old_log_probs=x["old_logprobs"],
            sum_pi_squared=x["sum_pi_squared"],
            handle_zero_tail=zero_tail,
        )

    return call


def more_advantage_cases() -> list[dict]:
    """The optimal-token baseline (and its multi-turn form, equal on masks without holes) and the vectorised
    GRPO and RLOO (verl's second implementations of the same estimators)."""
    out = []
    name = "optimal_token_baseline"
    for seed in range(4):
        for tail in (False, True):
            call = otb(C.compute_optimal_token_baseline_advantage, tail)
            out.append(advantage_case(name, seed, {"otb_zero_tail": tail}, call))
        tir = otb(C.compute_multi_turn_optimal_token_baseline_advantage, True)
        out.append(
            advantage_case(name, seed, {"otb_zero_tail": True}, tir, verl="tir_optimal_token_baseline")
        )
        for scale in (True, False):
            fn = outcome(C.compute_grpo_vectorized_outcome_advantage, norm_adv_by_std_in_grpo=scale)
            out.append(advantage_case("grpo", seed, {"scale_by_std": scale}, fn, verl="grpo_vectorized"))
        rloo = outcome(C.compute_rloo_vectorized_outcome_advantage)
        out.append(advantage_case("rloo", seed, {}, rloo, verl="rloo_vectorized"))
    return out


def kl_and_value_cases() -> list[dict]:
    """verl's KL estimators (value, and the gradient of sum(kl * advantages * mask) with respect to the
    logprobs; reference = the draw's old logprobs) and its clipped value loss (values = the draw's logprobs,
    old values = its old logprobs, returns = its advantages) under each aggregation, with its gradient."""
    out = []
    aggs = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    for seed in range(4):
        x = draw(seed)
        for name in ("k1", "k2", "k3"):  # verl's "k1+" and "k3+" raise NotImplementedError at b178a3c
            logprobs = x["logprobs"].clone().requires_grad_(True)
            kl = C.kl_penalty(logprobs, x["old_logprobs"], name)
            (kl * x["advantages"] * x["mask"]).sum().backward()
            res = {"kl": kl.detach() * x["mask"], "grad": logprobs.grad}
            out.append(case("kl", name, seed, {}, x, res, verl=f"kl_penalty({name})"))
        for agg in aggs:
            for clip in (0.2, 0.5):
                vpreds = x["logprobs"].clone().requires_grad_(True)
                loss, _ = C.compute_value_loss(
                    vpreds, x["advantages"], x["old_logprobs"], x["mask"], clip, agg
                )
                loss.backward()
                res = {"loss": loss.detach(), "grad": vpreds.grad}
                opts = {"clip_range": clip}
                out.append(case("value_loss", "value_loss", seed, opts, x, res, aggregation=agg))
    return out


def loss_cases() -> list[dict]:
    out = []
    aggs = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    ppo = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    for seed in range(4):
        for agg in aggs:
            dual = ppo | {"dual_clip_c": 3.0}
            out.append(loss_case("ppo", seed, dual, agg, "vanilla", Cfg(ppo, clip_ratio_c=3.0)))
            out.append(loss_case("reinforce", seed, {}, agg, "gpg", Cfg()))
            cispo = {"cispo_eps_low": 1.0, "cispo_eps_high": 0.28}
            out.append(
                loss_case("cispo", seed, cispo, agg, "cispo", Cfg(clip_ratio_low=1.0, clip_ratio_high=0.28))
            )
            for ratio in (2e-3, 0.1, 0.3):
                policy = Cfg(kl_cov_ratio=ratio, ppo_kl_coef=1.0)
                opts = {"kl_cov_ratio": ratio, "kl_cov_coef": 1.0}
                out.append(loss_case("kl_cov", seed, opts, agg, "kl_cov", Cfg(policy_loss=policy)))
            # clip_cov_ratio = 1 cuts every candidate, so verl's random pick among them is no pick at all.
            for lb, ub in ((0.0, 0.5), (0.2, 5.0)):
                policy = Cfg(clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub)
                opts = {"clip_cov_ratio": 1.0, "clip_cov_lb": lb, "clip_cov_ub": ub} | ppo
                out.append(loss_case("clip_cov", seed, opts, agg, "clip_cov", Cfg(ppo, policy_loss=policy)))
        # verl's geo_mean, gspo and sapo always take the mean over sequences of token means.
        for clip in (0.4, 0.1):
            opts = {"gmpo_clip_low": clip, "gmpo_clip_high": clip}
            cfg = Cfg(clip_ratio=clip, clip_ratio_low=clip, clip_ratio_high=clip)
            out.append(loss_case("gmpo", seed, opts, "seq-mean-token-mean", "geo_mean", cfg))
        for low, high in ((3e-4, 4e-4), (0.05, 0.1)):
            opts = {"gspo_clip_low": low, "gspo_clip_high": high}
            cfg = Cfg(clip_ratio_low=low, clip_ratio_high=high)
            out.append(loss_case("gspo", seed, opts, "seq-mean-token-mean", "gspo", cfg))
        opts = {"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05}
        out.append(
            loss_case("sapo", seed, opts, "seq-mean-token-mean", "sapo", Cfg(tau_pos=1.0, tau_neg=1.05))
        )
    return out


if __name__ == "__main__":
    torch.manual_seed(0)
    cases = advantage_cases() + loss_cases() + more_advantage_cases() + kl_and_value_cases()
    doc = {"verl_commit": sys.argv[1] if len(sys.argv) > 1 else "unknown", "draws": DRAWS, "cases": cases}
    OUT.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{len(cases)} cases -> {OUT}")
