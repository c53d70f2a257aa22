"""The `object_store` transport: the fallback on Ray, where no link between the processes is possible
(trainer and replicas on one GPU with unequal counts) or asked for (`cluster.weight_transport=object_store`).

Trainer rank 0 returns its weights on the CPU; the controller forwards the object reference, never the
tensors, and every replica resolves it from Ray's object store. The slowest way (two host copies and the
store), but it needs nothing beyond Ray. The Ray CLI test runs it end to end next to `broadcast`
(tests/integration/test_train_cli.py); the contract test drives it on threads.
"""

from __future__ import annotations

from ascent.transport.publish import ReplicaEnd, TrainerEnd, publish_forwarded


class ObjectStorePublisher:
    """`Publisher` through Ray's object store: rank 0's CPU tensors, forwarded as one object reference."""

    name = "object_store"
    in_process = False

    def __init__(self, trainer: TrainerEnd, replicas: ReplicaEnd) -> None:
        self.trainer, self.replicas = trainer, replicas

    def publish(self, version: int) -> None:
        publish_forwarded(self.trainer, self.replicas, version, to_cpu=True)

    def describe(self) -> str:
        return self.name
