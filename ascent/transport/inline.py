"""The `inline` transport: trainer and engine share one process (`cluster.backend=inline`).

The replica copies the trainer's tensors straight from its device (no copy to the CPU, no link); with the
engine on the trainer's GPU the update is one device-to-device copy per weight.
"""

from __future__ import annotations

from ascent.transport.publish import ReplicaEnd, TrainerEnd, publish_forwarded


class InlinePublisher:
    """`Publisher` for one process: rank 0's tensors are handed to the replica as they are."""

    name = "inline"
    in_process = True

    def __init__(self, trainer: TrainerEnd, replicas: ReplicaEnd) -> None:
        self.trainer, self.replicas = trainer, replicas

    def publish(self, version: int) -> None:
        publish_forwarded(self.trainer, self.replicas, version, to_cpu=False)

    def describe(self) -> str:
        return self.name
