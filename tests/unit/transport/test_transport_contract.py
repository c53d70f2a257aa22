"""Every weight transport that runs on a CPU goes through one contract, driven by its `Publisher` exactly as
the loop drives it: `publish(1)` leaves every replica holding exactly the trainer's tensors at version 1,
`publish(2)` the next ones; a replica that reports another version, and a link that waits in vain, are
errors naming what was waited for (and the knob). The worker groups are threads over small fake workers
(the real workers' publication methods in miniature); `broadcast` runs over gloo between those threads.

Not here: `cuda_ipc` needs GPUs (its module imports here; tests/gpu/test_cuda_ipc_gpu.py runs it), and the
object store through a real Ray cluster (tests/integration/test_train_cli.py publishes over `object_store`
and `broadcast` on Ray and checks the two runs are the same run).
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import torch

from ascent.cluster.base import PendingCall, W, WorkerGroup, find_free_port
from ascent.config.schema import ClusterConfig
from ascent.transport import select
from ascent.transport.publish import ReplicaEnd, TrainerEnd
from ascent.transport.weights import WeightSyncTimeout

CPU = torch.device("cpu")
ON_CPU = ("inline", "object_store", "broadcast")


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {
        "embed.weight": torch.randn(37, 8, generator=g),
        "layer.0.q.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "layer.0.norm.weight": torch.randn(8, generator=g).to(torch.float16),
        "ids": torch.arange(5, dtype=torch.int64) + version,
    }


class FakeTrainer:
    """A trainer rank holding `weights(version)`; rank 0 serves them (a broadcast sender only on rank 0)."""

    def __init__(self, rank: int, silent: bool = False) -> None:
        self.rank, self.silent, self.link = rank, silent, None
        self.weights = weights(0)

    def named_weights(self, to_cpu: bool = True) -> dict[str, torch.Tensor]:
        return dict(self.weights) if self.rank == 0 else {}

    def weight_transport_address(self) -> tuple[str, int]:
        return "127.0.0.1", find_free_port()

    def join_weight_transport(self, rv: Any) -> None:
        self.link = select.sender_link(rv, self.rank, CPU)

    def send_weights(self, version: int) -> int:
        if self.link is None or self.silent:
            return 0
        return self.link.send(self.weights.items(), version)


class FakeReplica:
    """A replica keeping a copy of what it was given; `lag` makes it report an older version."""

    def __init__(self, rank: int, lag: int = 0) -> None:
        self.rank, self.lag, self.link = rank, lag, None
        self.held: dict[str, torch.Tensor] = {}

    def update_weights(self, named: dict[str, torch.Tensor], version: int) -> int:
        self.held = {n: t.clone() for n, t in named.items()}
        return version - self.lag

    def join_weight_transport(self, rv: Any) -> None:
        self.link = select.receiver_link(rv, self.rank, CPU)

    def receive_weights(self, version: int) -> int:
        self.held = {}
        self.link.receive(lambda part: self.held.update({n: t.clone() for n, t in part}), version)
        return version - self.lag


class ThreadCall(PendingCall[Any]):
    def __init__(self, futures: list[Future]) -> None:
        self.futures = futures

    def get(self) -> list[Any]:
        return [f.result(timeout=60) for f in self.futures]

    def forward(self, index: int = 0) -> Any:
        return self.futures[index].result(timeout=60)

    def others(self, index: int = 0) -> list[Any]:
        return [f.result(timeout=60) for i, f in enumerate(self.futures) if i != index]


class ThreadGroup(WorkerGroup[W]):
    """Each worker's calls run on threads of their own, so both sides of a link run at once."""

    def __init__(self, cls: type[W], workers: list[W]) -> None:
        super().__init__(cls, name=cls.__name__, num_workers=len(workers), timeout_s=60)
        self.workers = workers

    def _submit(self, method: str, calls: Sequence[tuple[int, tuple, dict]], alongside: bool = False) -> Any:
        pool = ThreadPoolExecutor(max_workers=len(calls))
        futures = [pool.submit(getattr(self.workers[r], method), *a, **kw) for r, a, kw in calls]
        pool.shutdown(wait=False)
        return ThreadCall(futures)

    def shutdown(self) -> None:
        pass


def publisher(kind: str, trainers: list[FakeTrainer], replicas: list[FakeReplica], timeout_s: float = 20.0):
    trainer = TrainerEnd(
        ThreadGroup(FakeTrainer, trainers),
        named_weights=FakeTrainer.named_weights,
        address=FakeTrainer.weight_transport_address,
        join=FakeTrainer.join_weight_transport,
        send=FakeTrainer.send_weights,
    )
    replica = ReplicaEnd(
        ThreadGroup(FakeReplica, replicas),
        update_weights=FakeReplica.update_weights,
        join=FakeReplica.join_weight_transport,
        receive=FakeReplica.receive_weights,
    )
    return select.build_publisher(kind, trainer, replica, timeout_s, bucket_bytes=256)  # several buckets


@pytest.mark.parametrize("kind", ON_CPU)
def test_each_publication_leaves_every_replica_holding_exactly_that_version(kind):
    trainers, replicas = [FakeTrainer(0), FakeTrainer(1)], [FakeReplica(0), FakeReplica(1)]
    pub = publisher(kind, trainers, replicas)
    assert pub.name == kind and pub.in_process == (kind == "inline") and pub.describe().startswith(kind)
    for version in (1, 2):
        trainers[0].weights = trainers[1].weights = weights(version)
        pub.publish(version)
        for replica in replicas:
            assert replica.held.keys() == weights(version).keys()
            for name, t in weights(version).items():
                assert replica.held[name].dtype == t.dtype and torch.equal(replica.held[name], t), name


@pytest.mark.parametrize("kind", ON_CPU)
def test_a_replica_reporting_another_version_fails_the_publication(kind):
    pub = publisher(kind, [FakeTrainer(0)], [FakeReplica(0), FakeReplica(1, lag=1)])
    with pytest.raises(RuntimeError, match=r"publication of version 3: the rollout replicas report \[3, 2\]"):
        pub.publish(3)


def test_a_link_publication_nobody_sends_fails_naming_what_it_waited_for_and_the_knob():
    pub = publisher("broadcast", [FakeTrainer(0, silent=True)], [FakeReplica(0)], timeout_s=2.0)
    with pytest.raises(WeightSyncTimeout) as err:
        pub.publish(1)
    message = str(err.value)
    assert "'broadcast'" in message and "version 1" in message and "cluster.weight_sync_timeout_s" in message


def test_every_transport_the_config_names_has_one_publisher():
    named = set(typing.get_args(ClusterConfig.model_fields["weight_transport"].annotation)) - {"auto"}
    assert named | {"inline"} == set(select.FORWARDED) | set(select.LINKS)


@pytest.mark.parametrize(
    ("backend", "requested", "placement", "device", "gpus", "trainers", "replicas", "chosen"),
    [
        ("inline", "auto", "colocated", "cuda", 1, 1, 1, "inline"),
        ("ray", "object_store", "split", "cuda", 1, 1, 1, "object_store"),
        ("ray", "auto", "colocated", "cuda", 1, 2, 2, "cuda_ipc"),
        ("ray", "auto", "colocated", "cuda", 1, 2, 1, "object_store"),  # one-to-one IPC impossible
        ("ray", "auto", "split", "cuda", 0.5, 1, 2, "object_store"),  # a shared GPU: NCCL needs distinct
        ("ray", "auto", "split", "cuda", 1, 1, 2, "broadcast"),
        ("ray", "auto", "colocated", "cpu", 0, 1, 1, "broadcast"),  # gloo between CPU processes
    ],
)
def test_the_transport_is_chosen_in_one_place(
    backend, requested, placement, device, gpus, trainers, replicas, chosen
):
    assert select.choose(backend, requested, placement, device, gpus, trainers, replicas) == chosen
