"""Which decode rows share their leading KV pages: the groups of shared-prefix ("cascade") decode attention.

The n samples of one GRPO prompt are forked from one prefill, so their block tables start with the same
full prompt pages (copy-on-write copies only the last, partial page; prefix.py shares pages across requests
too). triton_cascade.py attends such a group's query heads to those pages in one pass, reading each K/V
byte once per group instead of once per row, and the per-row decode kernel then covers only each row's own
tokens. This module decides the groups (pure Python) and lays them out as one int32 table the kernels read.

A row's **key** is the tuple of its full pages that lie strictly before the position it decodes next,
taken when the row is admitted (`shareable_pages`): those pages hold computed K/V that no later step of the
row writes (a row writes only at its newest position, always past them), so any rows with equal keys may
read them together. Rows group by equal keys (a GRPO prompt's samples have equal keys); a group holds at
most `members` rows (a larger one is cut into near-equal parts); a row alone with its key is in no group
(nothing to share: it keeps the plain kernel's path).

The table (`pack_groups`) is [rows, 2 + members] int32, filled for every row of the decode state:
- column 0 of row r: the slot of r's group, -1 for a row in no group;
- columns 1.. of row g (g a group slot, slots numbered 0, 1, ... in the order of their smallest row): the
  group's shared page count n, then its member rows (the first is the one whose page table the prefix
  kernel reads; -1 pads).
A group has at least two rows, so the slots of a batch's groups sit in rows [0, b/2) of the table, below
its batch bucket b: the rows [0, b) of the table are all a step needs (and all tensor parallelism
broadcasts, tensor_parallel.py). The decode state rebuilds the table whenever a row is admitted, released
or moved (state.py), so it never describes a row's previous occupant; the decode kernel also checks each
row's claim (it is listed, its pages are the group's, its context lies past them) before using the group
(triton_decode.py `_group_claim`), so a stale table could cost the saving but not the result.
"""

from __future__ import annotations

from collections.abc import Sequence

MEMBERS = 8  # the most rows of a group (a power of two): MEMBERS x G query heads form one prefix-kernel tile


def shareable_pages(pages: Sequence[int], position: int, page_size: int) -> tuple[int, ...]:
    """A row's key: its page ids [P] whose every token lies before `position` (the next it decodes), cut
    before the first trash page 0 (an unset table entry)."""
    full = list(pages[: max(0, position) // page_size])
    if 0 in full:
        full = full[: full.index(0)]
    return tuple(full)


def find_groups(keys: Sequence[tuple[int, ...]], members: int = MEMBERS) -> list[tuple[list[int], int]]:
    """keys[r]: row r's key (empty: idle or nothing shareable) -> groups as (rows ascending, shared pages),
    ordered by their smallest row. Rows with equal non-empty keys group; a set of k > `members` such rows
    is cut into ceil(k / members) near-equal groups of consecutive rows; a lone row is in none."""
    by_key: dict[tuple[int, ...], list[int]] = {}
    for row, key in enumerate(keys):
        if key:
            by_key.setdefault(key, []).append(row)
    groups = []
    for key, rows in by_key.items():
        parts = -(-len(rows) // members)
        size, extra = divmod(len(rows), parts)
        start = 0
        for i in range(parts):
            end = start + size + (i < extra)
            if end - start >= 2:
                groups.append((rows[start:end], len(key)))
            start = end
    return sorted(groups, key=lambda g: g[0][0])


def pack_groups(
    groups: Sequence[tuple[list[int], int]], rows: int, members: int = MEMBERS
) -> list[list[int]]:
    """Groups (from `find_groups`) -> the table [rows][2 + members] of the module doc (host lists)."""
    assert 2 * len(groups) <= rows, "a group has at least two rows"
    table = [[-1, 0] + [-1] * members for _ in range(rows)]
    for slot, (rows_of, n) in enumerate(groups):
        assert 2 <= len(rows_of) <= members and n > 0
        table[slot][1] = n
        table[slot][2 : 2 + len(rows_of)] = rows_of
        for r in rows_of:
            table[r][0] = slot
    return table
