"""Shared-prefix groups (prefix_groups.py) and how the decode state keeps them (state.py): the grouping of
rows by their shareable pages, the cap on members, and no stale group after a row is released, reused by
another request or moved by compaction."""

from __future__ import annotations

import torch

from ascent.messages import SamplingParams
from ascent.rollout.fast.prefix_groups import MEMBERS, find_groups, pack_groups, shareable_pages
from ascent.rollout.fast.sequence import Sequence
from ascent.rollout.fast.state import DecodeState

PS = 16


def test_shareable_pages_are_the_full_pages_before_the_next_position():
    pages = [7, 3, 9, 12]
    assert shareable_pages(pages, 48, PS) == (7, 3, 9)  # position 48 starts page 3: pages 0..2 are full
    assert shareable_pages(pages, 47, PS) == (7, 3)  # position 47 is the last of page 2: not before it
    assert shareable_pages(pages, 15, PS) == ()
    assert shareable_pages([5, 0, 0], 40, PS) == (5,)  # stops at an unset (trash) entry
    assert shareable_pages([], 40, PS) == ()


def test_rows_with_equal_keys_group_and_lone_rows_do_not():
    keys = [(1, 2), (), (1, 2), (5,), (1, 2, 3), (1, 2), (5,), (8,)]
    assert find_groups(keys) == [([0, 2, 5], 2), ([3, 6], 1)]  # (1, 2, 3) shares only a prefix: alone


def test_large_groups_are_cut_at_the_member_cap_into_near_equal_parts():
    keys = [(9, 8)] * 19 + [(3,)] * 9
    groups = find_groups(keys, members=8)
    sizes = [len(r) for r, _ in groups]
    assert sorted(sizes) == [4, 5, 6, 6, 7] and all(n == (2 if r[0] < 19 else 1) for r, n in groups)
    assert sorted(r for rows, _ in groups for r in rows) == list(range(28))
    assert find_groups([(1,)] * 9, members=8) == [([0, 1, 2, 3, 4], 1), ([5, 6, 7, 8], 1)]


def test_pack_groups_layout():
    table = pack_groups([([1, 4, 6], 3), ([2, 5], 1)], 8, members=4)
    assert table[0] == [-1, 3, 1, 4, 6, -1] and table[1] == [0, 1, 2, 5, -1, -1]
    assert [row[0] for row in table] == [-1, 0, 1, -1, 0, 1, 0, -1]
    assert all(row[1:] == [0, -1, -1, -1, -1] for row in table[2:])


def _seq(pages: list[int], position: int) -> Sequence:
    return Sequence(
        req=0,
        sample=0,
        prompt=[1] * position,
        params=SamplingParams(),
        seed=1,
        max_new=8,
        stop_ids=frozenset(),
        pages=list(pages),
        num_cached=position,
        tokens=[2],
    )


def _groups(st: DecodeState) -> list[tuple[list[int], int]]:
    """The device table read back -> [(member rows, n)] by slot."""
    assert st.groups is not None
    t = st.groups.tolist()
    out = [([r for r in row[2:] if r >= 0], row[1]) for row in t if row[1] > 0]
    for slot, (rows, _) in enumerate(out):
        assert all(t[r][0] == slot for r in rows)
    assert sum(row[0] >= 0 for row in t) == sum(len(r) for r, _ in out)
    return out


def test_decode_state_keeps_no_stale_group():
    st = DecodeState(8, 6, 32, torch.device("cpu"), share_page_size=PS)
    assert _groups(st) == []
    prompt = [11, 12, 13]  # three full pages, then each sample's own copy of the partial last page
    st.admit([_seq(prompt + [20 + i], 3 * PS + 5) for i in range(4)], [0, 2, 3, 5])
    st.admit([_seq([40, 41, 50 + i], 2 * PS + 1) for i in range(2)], [1, 4])
    assert _groups(st) == [([0, 2, 3, 5], 3), ([1, 4], 2)]
    st.set_pages([0, 2], [4, 4], [60, 61])  # a new page changes no group
    assert _groups(st) == [([0, 2, 3, 5], 3), ([1, 4], 2)]
    st.release([4])  # row 4's group is left with one row: gone
    assert _groups(st) == [([0, 2, 3, 5], 3)]
    st.release([2])
    st.admit([_seq([70, 71, 72], 3 * PS + 2)], [2])  # row 2 reused by another prompt: not in the group
    assert _groups(st) == [([0, 3, 5], 3)]
    st.admit([_seq([70, 71, 72, 73], 3 * PS + 9)], [4])  # ... until a sample of that prompt joins it
    assert _groups(st) == [([0, 3, 5], 3), ([2, 4], 3)]
    st.compact([0, 2, 3, 4, 5], 6)  # rows move down: the groups move with them
    assert _groups(st) == [([0, 2, 4], 3), ([1, 3], 3)]
    st.release(list(range(8)))
    assert _groups(st) == [] and st.share_keys == [()] * 8


def test_decode_state_caps_members_and_fed_rows_share_only_computed_pages():
    st = DecodeState(24, 6, 32, torch.device("cpu"), share_page_size=PS)
    st.admit([_seq([1, 2, 3, 100 + i], 3 * PS + 1) for i in range(20)], list(range(20)))
    groups = _groups(st)
    assert [len(r) for r, _ in groups] == [7, 7, 6] and max(len(r) for r, _ in groups) <= MEMBERS
    # a fed row (state.py, prompt feeding): its position is where its cached prefix ends, so the pages its
    # prompt still has to fill are not part of its key
    st.admit([_seq([1, 2, 3, 200], 1 * PS)], [20])
    assert st.share_keys[20] == (1,) and len(_groups(st)) == 3


def test_no_groups_without_the_option():
    st = DecodeState(4, 4, 32, torch.device("cpu"))
    st.admit([_seq([1, 2, 9 + i], 2 * PS + 1) for i in range(2)], [0, 1])
    st.release([0])
    assert st.groups is None


def test_the_option_is_on_by_default_with_triton_only_and_never_batch_invariant(fast_tiny_path):
    """shared_prefix (default on: runner.SHARED_PREFIX) only ever runs on the Triton decode kernel, never in
    the batch-invariant mode, and `false` turns it off."""
    from ascent.rollout.fast import build_fast_engine

    kw = dict(model_path=fast_tiny_path, dtype="fp32", device="cpu", page_size=16, max_model_len=64)
    on = {"shared_prefix": True}
    cases = [({}, False), ({"attention": "torch", "attn_options": on}, False)]
    cases += [({"attention": "triton", "batch_invariant": True, "attn_options": on}, False)]
    cases += [({"attention": "triton", "attn_options": on}, True), ({"attention": "triton"}, True)]
    cases += [({"attention": "triton", "attn_options": {"shared_prefix": False}}, False)]
    cases += [({"attention": "triton", "batch_invariant": True}, False)]
    for extra, want in cases:
        engine = build_fast_engine(**kw, **extra)
        assert engine.runner.shared_prefix == want and (engine.state.groups is not None) == want, extra
