"""Packing named tensors into flat byte buckets and reading them back (the weight transport's wire format).

A bucket is one contiguous uint8 tensor holding several weights back to back, each at a 16-byte-aligned
offset, plus a list of `TensorMeta` that says where each one lies. Sending a model as a few large buckets
instead of hundreds of small tensors keeps a broadcast or an IPC exchange at a handful of round trips, and
no side ever holds more than one bucket beyond the model itself. Pure functions; only torch is imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

ALIGN = 16  # bytes: every tensor starts at a multiple of this, so a uint8 slice can be viewed as its dtype


@dataclass(frozen=True)
class TensorMeta:
    """Where one weight lies in a bucket: `nbytes` bytes from `offset`, read back as `dtype` of `shape`."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def layout(tensors: list[tuple[str, Tensor]]) -> tuple[list[TensorMeta], int]:
    """(name, tensor) pairs -> their metas and the bucket size in bytes (aligned offsets, in order)."""
    metas, offset = [], 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        metas.append(TensorMeta(name, tuple(t.shape), t.dtype, offset, nbytes))
        offset = _aligned(offset + nbytes)
    return metas, offset


def pack(tensors: list[tuple[str, Tensor]], out: Tensor) -> list[TensorMeta]:
    """Copy the tensors into `out` (uint8 [>= bucket size], any device) at their layout; returns the metas."""
    metas, size = layout(tensors)
    if out.dtype != torch.uint8 or out.numel() < size:
        raise ValueError(f"pack: the buffer holds {out.numel()} uint8, the bucket needs {size}.")
    for meta, (_, t) in zip(metas, tensors, strict=True):
        if meta.nbytes:
            src = t.detach().contiguous().reshape(-1).view(torch.uint8)
            out[meta.offset : meta.offset + meta.nbytes].copy_(src, non_blocking=True)
    return metas


def unpack(buffer: Tensor, metas: list[TensorMeta]) -> list[tuple[str, Tensor]]:
    """Views into `buffer` (uint8) of the tensors `metas` describe; nothing is copied."""
    out = []
    for m in metas:
        raw = buffer[m.offset : m.offset + m.nbytes]
        out.append((m.name, raw.view(m.dtype).view(m.shape)))
    return out


def batched(named: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, Tensor]]]:
    """Group a stream of (name, tensor) into lists of about `bucket_bytes` each (a larger tensor alone)."""
    current: list[tuple[str, Tensor]] = []
    size = 0
    for name, t in named:
        nbytes = _aligned(t.numel() * t.element_size())
        if current and size + nbytes > bucket_bytes:
            yield current
            current, size = [], 0
        current.append((name, t))
        size += nbytes
    if current:
        yield current
