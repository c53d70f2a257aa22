"""The weight transport on CPU: buckets round-trip every dtype and shape, and a gloo `broadcast` link carries
a publication from one sender to two receivers exactly, bucket by bucket, with named errors on a version
mismatch and on a sender that never comes."""

from __future__ import annotations

import threading

import pytest
import torch

from ascent.cluster.base import find_free_port
from ascent.transport.buckets import ALIGN, batched, layout, pack, unpack
from ascent.transport.select import receiver_link, sender_link
from ascent.transport.weights import Rendezvous, WeightSyncTimeout


def weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(37, 8, generator=g),
        "layer.0.q.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "layer.0.norm.weight": torch.randn(8, generator=g).to(torch.float16),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "ids": torch.arange(5, dtype=torch.int64),
        "transposed": torch.randn(6, 3, generator=g).t(),  # not contiguous
    }


def test_pack_unpack_round_trip_is_exact_and_aligned():
    named = list(weights().items())
    metas, size = layout(named)
    assert all(m.offset % ALIGN == 0 for m in metas) and size % ALIGN == 0
    buffer = torch.full((size + 7,), 255, dtype=torch.uint8)
    out = dict(unpack(buffer, pack(named, buffer)))
    for name, t in named:
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name], t), name


def test_pack_refuses_a_small_buffer():
    with pytest.raises(ValueError, match="the bucket needs"):
        pack(list(weights().items()), torch.empty(8, dtype=torch.uint8))


def test_batched_keeps_buckets_near_the_size_and_a_large_tensor_alone():
    named = [(f"w{i}", torch.zeros(100)) for i in range(5)] + [
        ("big", torch.zeros(2000)),
        ("tail", torch.zeros(1)),
    ]
    parts = list(batched(named, 900))  # 416 bytes per small tensor: two fit in 900
    assert [[n for n, _ in p] for p in parts] == [["w0", "w1"], ["w2", "w3"], ["w4"], ["big"], ["tail"]]


def _rendezvous(replicas: int, timeout_s: float = 20.0, bucket_bytes: int = 512) -> Rendezvous:
    return Rendezvous("broadcast", "127.0.0.1", find_free_port(), replicas, timeout_s, bucket_bytes)


def _run_all(targets) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_broadcast_link_publishes_versions_to_two_receivers_exactly():
    rv = _rendezvous(2, bucket_bytes=200)  # several buckets for these weights
    cpu = torch.device("cpu")
    links: dict[int, object] = {}
    got: dict[int, list[dict[str, torch.Tensor]]] = {1: [], 2: []}

    def join(rank):
        def run():
            links[rank] = sender_link(rv, 0, cpu) if rank == 0 else receiver_link(rv, rank - 1, cpu)

        return run

    assert _run_all([join(r) for r in range(3)]) == []
    for version in (1, 2):
        sent = {k: v * version if v.is_floating_point() else v for k, v in weights().items()}
        buckets: dict[int, int] = {1: 0, 2: 0}

        def receive(rank, version=version, buckets=buckets):
            def apply(bucket):
                buckets[rank] += 1
                got[rank].append({n: t.clone() for n, t in bucket})

            return lambda: links[rank].receive(apply, version)

        errors = _run_all([lambda s=sent, v=version: links[0].send(s.items(), v), receive(1), receive(2)])
        assert errors == []
        for rank in (1, 2):
            assert buckets[rank] > 2
            received = {n: t for part in got[rank][-buckets[rank] :] for n, t in part.items()}
            assert received.keys() == sent.keys()
            for name, t in sent.items():
                assert torch.equal(received[name], t.contiguous()), (rank, name)


def test_a_receiver_waiting_for_another_version_is_told_so():
    rv = _rendezvous(1, timeout_s=4.0)  # the sender then waits for the receiver that gave up, this long
    cpu = torch.device("cpu")
    links: dict[int, object] = {}
    _run_all(
        [
            lambda: links.__setitem__(0, sender_link(rv, 0, cpu)),
            lambda: links.__setitem__(1, receiver_link(rv, 0, cpu)),
        ]
    )
    errors = _run_all(
        [lambda: links[0].send(weights().items(), 3), lambda: links[1].receive(lambda p: None, 2)]
    )
    assert any("waiting for version 2 got version 3" in str(e) for e in errors), errors


def test_a_sender_that_never_comes_fails_with_the_knob_named():
    rv = _rendezvous(1, timeout_s=2.0)
    errors = _run_all([lambda: receiver_link(rv, 0, torch.device("cpu"))])
    assert len(errors) == 1 and isinstance(errors[0], WeightSyncTimeout)
    assert "cluster.weight_sync_timeout_s" in str(errors[0]) and "broadcast" in str(errors[0])
