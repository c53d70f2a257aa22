"""The optimal-token baseline's Σπ² comes from the old-logprob pass (`loop._old_logprobs`): a run whose
estimator reads it always takes that pass, through the trainer's `compute_logprobs_and_sum_pi_squared`, even
where `train.old_logprobs=auto` would skip it; every other run calls `compute_logprobs` as before, or nothing."""

from __future__ import annotations

from types import SimpleNamespace

from ascent.config.schema import RunConfig
from ascent.orchestrator import loop
from ascent.orchestrator.setup import reads_sum_pi_squared


class Policy:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def compute_logprobs(self, samples, temperature, which):
        self.calls.append(which)
        return [[-1.0] * n for n in samples]

    def compute_logprobs_and_sum_pi_squared(self, samples, temperature):
        self.calls.append("with_sum_pi_squared")
        return [[-1.0] * n for n in samples], [[0.5] * n for n in samples]


class Group:
    """Two trainer ranks, called in the controller's process."""

    num_workers = 2

    def __init__(self) -> None:
        self.worker = SimpleNamespace(policy=Policy())

    def call_split(self, method, shards, **kwargs):
        return [method(self.worker, shard, **kwargs) for shard in shards]


def run(sum_pi_squared: bool) -> SimpleNamespace:
    return SimpleNamespace(trainer=Group(), temperature=1.0, sum_pi_squared=sum_pi_squared)


def test_only_the_optimal_token_baseline_reads_sum_pi_squared():
    assert reads_sum_pi_squared(RunConfig(algorithm={"advantage": "optimal_token_baseline"}))
    assert not reads_sum_pi_squared(RunConfig())


def test_the_pass_gives_both_in_sample_order_even_where_auto_would_skip_it():
    r = run(True)
    old, sq = loop._old_logprobs(r, [1, 2, 3], reuse=True)
    assert old == [[-1.0], [-1.0] * 2, [-1.0] * 3] and sq == [[0.5], [0.5] * 2, [0.5] * 3]
    assert r.trainer.worker.policy.calls == ["with_sum_pi_squared"] * 2


def test_other_runs_pay_nothing_for_it():
    r = run(False)
    assert loop._old_logprobs(r, [1, 2], reuse=True) == (None, None)
    assert r.trainer.worker.policy.calls == []
    old, sq = loop._old_logprobs(r, [1, 2], reuse=False)
    assert old == [[-1.0], [-1.0] * 2] and sq is None
    assert r.trainer.worker.policy.calls == ["policy", "policy"]
