"""pass@k (Chen et al. 2021's unbiased estimator), mean@k and the per-data_source / per-environment split."""

from __future__ import annotations

from math import comb

import pytest

from ascent.messages import Episode
from ascent.orchestrator.eval_metrics import ScoredSample, episode_sample, eval_metrics, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "want"),
    [
        (4, 1, 1, 0.25),  # pass@1 is the share correct
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - comb(7, 5) / comb(10, 5)),  # 1 - 21/252
        (3, 1, 3, 1.0),  # n = k: one correct among all n
        (3, 0, 3, 0.0),  # n = k, none correct
        (8, 8, 4, 1.0),  # all correct
        (8, 0, 1, 0.0),  # none correct
        (8, 6, 4, 1.0),  # n - c < k: every draw of 4 holds a correct one
    ],
)
def test_pass_at_k_matches_hand_computed_values(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(2, 0, 3), (2, 3, 1), (2, 1, 0)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(n, c, k)


def _samples() -> list[ScoredSample]:
    # prompt 0 (gsm8k): rewards 1, 0, 0, 0; prompt 1 (math, env sql): 1, 1, 0, 1
    out = [ScoredSample(0, r, "gsm8k", None, {"format": 0.5}) for r in (1.0, 0.0, 0.0, 0.0)]
    return out + [ScoredSample(1, r, "math", "sql", {"format": 1.0}) for r in (1.0, 1.0, 0.0, 1.0)]


def test_pass_and_mean_at_k_overall_and_per_source():
    m = eval_metrics(_samples(), ks=(1, 2, 4))
    assert m["accuracy"] == pytest.approx(4 / 8) and m["pass@1"] == pytest.approx(0.5)
    assert m["pass@2"] == pytest.approx((0.5 + 1.0) / 2)  # prompt 1: 1 - C(1,2)/C(4,2) = 1
    assert m["pass@4"] == 1.0
    assert m["mean@2"] == pytest.approx((0.5 + 1.0) / 2)  # the first two samples of each prompt
    assert m["mean@4"] == pytest.approx((0.25 + 0.75) / 2)
    assert m["source/gsm8k/pass@2"] == pytest.approx(0.5) and m["source/math/pass@2"] == 1.0
    assert m["source/math/mean@4"] == pytest.approx(0.75)
    assert m["env/sql/pass@1"] == pytest.approx(0.75) and not any(k.startswith("env/None") for k in m)
    assert m["reward/format"] == pytest.approx(0.75)


def test_a_prompt_short_of_k_samples_counts_toward_no_pass_at_k():
    samples = [ScoredSample(0, 1.0), ScoredSample(0, 1.0), ScoredSample(1, 0.0)]
    m = eval_metrics(samples, ks=(2,))
    assert m["pass@2"] == 1.0 and m["reward_mean"] == pytest.approx(2 / 3)
    assert eval_metrics([], ks=(1,)) == {}


def test_episode_sample_reads_the_row_columns_and_counts():
    e = Episode(
        [1],
        [2],
        [0.0],
        [1],
        "stop",
        row_id=3,
        reward=1.0,
        reward_components={"judge": 0.5},
        metadata={"data_source": "gsm8k", "turns": 2, "tool_calls": 1, "env_info": {"guesses": 3}},
    )
    s = episode_sample(e, env="calc")
    assert (s.prompt, s.data_source, s.env) == (3, "gsm8k", "calc")
    assert s.numbers == {"judge": 0.5, "turns": 2.0, "tool_calls": 1.0, "env_info/guesses": 3.0}
    m = eval_metrics([s])
    assert (m["reward/judge"], m["turns_mean"], m["env_info/guesses"]) == (0.5, 2.0, 3.0)
    assert (
        episode_sample(Episode([1], [2], [0.0], [1], "stop", 0, metadata={"env": "sql"}), "calc").env == "sql"
    )
