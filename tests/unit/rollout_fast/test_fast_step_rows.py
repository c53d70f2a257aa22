"""The decode step's own small pieces, as pure functions (state.step_rows, runner.step_inputs): the runner
compiles them into the captured step, so what they compute is pinned here by hand."""

import torch

from ascent.rollout.fast.runner import step_inputs
from ascent.rollout.fast.state import step_rows


def _rows():
    return dict(
        out_tokens=torch.zeros(3, dtype=torch.long),
        out_logprobs=torch.zeros(3),
        positions=torch.tensor([5, 9, 0]),
        input_ids=torch.tensor([1, 2, 3]),
        steps=torch.tensor([4, 0, 0]),
        active=torch.tensor([1, 1, 0]),
    )


def test_step_rows_without_feed_publishes_and_moves_active_rows():
    r = _rows()
    tokens, lps = torch.tensor([7, 8, 9]), torch.tensor([-0.5, -1.0, -2.0])
    step_rows(tokens, lps, *r.values(), None)
    assert r["out_tokens"].tolist() == [7, 8, 9] and r["out_logprobs"].tolist() == [-0.5, -1.0, -2.0]
    assert r["input_ids"].tolist() == [7, 8, 9]
    assert r["positions"].tolist() == [6, 10, 0]  # the idle row stays
    assert r["steps"].tolist() == [5, 1, 0]


def test_step_rows_feeds_the_prompt_before_counting_sampling_steps():
    r = _rows()
    # row 0 has read its whole prompt; row 1 is at prompt token 1 of 3 (the next input is buf[1, 1])
    feed_pos, feed_len = torch.tensor([2, 1, 0]), torch.tensor([2, 3, 0])
    buf = torch.tensor([[40, 41, 0], [50, 51, 52], [0, 0, 0]])
    step_rows(torch.tensor([7, 8, 9]), torch.zeros(3), *r.values(), (feed_pos, feed_len, buf))
    assert r["input_ids"].tolist() == [7, 51, 9]  # row 1's sample is thrown away for its prompt token
    assert r["steps"].tolist() == [5, 0, 0]  # only a real token counts as a sampling step
    assert feed_pos.tolist() == [2, 2, 0]
    assert r["positions"].tolist() == [6, 10, 0]


def test_step_inputs_clamps_positions_and_zeroes_idle_contexts():
    embed = torch.arange(12.0).view(4, 3)
    cos, sin = torch.arange(8.0).view(8, 1).expand(8, 2), -torch.arange(8.0).view(8, 1).expand(8, 2)
    ids, pos, act = torch.tensor([3, 0, 1]), torch.tensor([2, 11, 4]), torch.tensor([1, 1, 0])
    x, ctx, c, s = step_inputs(ids, pos, act, None, embed, (cos, sin), 8)
    assert torch.equal(x, embed[ids])
    assert ctx.dtype == torch.int32 and ctx.tolist() == [3, 8, 0]  # past max_len: clamped; idle: 0
    assert c[:, 0].tolist() == [2.0, 7.0, 4.0] and s[:, 0].tolist() == [-2.0, -7.0, -4.0]
    _, _, c, _ = step_inputs(ids, pos, act, torch.tensor([1, -20, 0]), embed, (cos, sin), 8)
    assert c[:, 0].tolist() == [3.0, 0.0, 4.0]  # multimodal rows rotate by position + delta, clamped
