"""The vocab-parallel head's sampling math without processes: the logits of a batch cut into 2 or 3 vocabulary
slices (uneven too), each reduced to its candidates and combined, give the tokens `sample` gives on the whole
logits (bit for bit: the same noise by global token id) and its logprobs within 1e-5, sampled, greedy and
mixed; and ties go to the lowest token id as argmax over the whole vocabulary does."""

from __future__ import annotations

import pytest
import torch

from ascent.messages import SamplingParams
from ascent.rollout.fast.tp_head import combine, local_candidates, vocab_slice
from ascent.rollout.sampling import SamplingTensors, sample


def _split_sample(logits, st: SamplingTensors, steps, size: int):
    stats = []
    for r in range(size):
        start, end = vocab_slice(logits.shape[1], r, size)
        stats.append(
            local_candidates(logits[:, start:end], st.temperature, st.seeds, steps, start, st.all_greedy)
        )
    return combine(torch.stack(stats))


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("temps", [[1.0, 0.7, 1.3, 0.5], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.8]])
def test_split_sampling_draws_what_the_whole_vocabulary_draws(size, temps):
    g = torch.Generator().manual_seed(size)
    logits = torch.randn(len(temps), 101, generator=g) * 3  # 101: slices of 51+50 and 34+34+33
    params = [SamplingParams(temperature=t) for t in temps]
    st = SamplingTensors.from_params(params, [11, 2**40 + 3, 7, 99], "cpu")
    st.use_top_k_top_p = st.use_min_p = st.use_penalty = False
    for step in range(40):  # many draws: a wrong noise key would differ somewhere
        steps = torch.full((len(temps),), step)
        tok, lp = sample(logits, st, steps)
        tok_s, lp_s = _split_sample(logits, st, steps, size)
        assert torch.equal(tok_s, tok)
        assert torch.allclose(lp_s, lp, atol=1e-5, rtol=0)
    if temps[0] > 0:  # (noise, not the max, decided some draws)
        assert len({int(t) for t in _split_sample(logits, st, torch.arange(4), size)[0]}) > 1


def test_ties_go_to_the_lowest_token_id():
    logits = torch.zeros(2, 10)
    logits[:, [2, 7]] = 5.0  # ranks 0 and 1 of two hold one maximum each
    st = SamplingTensors.from_params([SamplingParams(temperature=0.0)] * 2, [0, 1], "cpu")
    tok, _ = _split_sample(logits, st, torch.zeros(2, dtype=torch.long), 2)
    assert tok.tolist() == [2, 2]


def test_slices_cover_the_vocabulary_once():
    assert [vocab_slice(10, r, 3) for r in range(3)] == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(ValueError, match="vocab_parallel"):
        vocab_slice(1 << 24, 0, 2)
