"""The thin Ray actor that hosts one worker: it sets the rank environment, opens the worker's log file,
constructs the user's class and runs its methods by name.

Construction happens in `init_worker`, after the group has learned every actor's node (for LOCAL_RANK and
MASTER_ADDR), so a failing constructor is an ordinary task error, not a dead actor. `execute` runs the
worker's calls in order on the actor's main thread; `execute_alongside` runs one on a thread of its own
(concurrency group `alongside`), next to the call in progress.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from ascent.cluster.base import find_free_port
from ascent.tracking.logs import setup_logging

ALONGSIDE = "alongside"  # the concurrency group of calls that run next to the call in progress


class RayWorkerHost:
    """Hosts one worker object inside a Ray actor process. Not used directly: see `RayWorkerGroup`."""

    def __init__(self, group: str, rank: int, run_dir: str | None, log_level: str = "INFO") -> None:
        self.group, self.rank = group, rank
        self.log = setup_logging(run_dir, f"{group}_{rank}", log_level, console=False)
        self.worker: Any = None

    def node_info(self) -> dict[str, Any]:
        """Where this actor runs: node id and IP, the GPU ids Ray gave it, a free port on its node."""
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "free_port": find_free_port(),
        }

    def init_worker(self, cls: type, env: dict[str, str], args: tuple, kwargs: dict[str, Any]) -> None:
        """Set the environment, then construct the worker."""
        os.environ.update(env)
        self.log.info(
            "starting %s (rank %s of %s) on node %s (local rank %s of %s), rendezvous at %s:%s",
            cls.__name__,
            env.get("RANK"),
            env.get("WORLD_SIZE"),
            ray.get_runtime_context().get_node_id(),
            env.get("LOCAL_RANK"),
            env.get("LOCAL_WORLD_SIZE"),
            env.get("MASTER_ADDR"),
            env.get("MASTER_PORT"),
        )
        try:
            self.worker = cls(*args, **kwargs)
        except Exception:
            self.log.exception("%s.__init__ failed", cls.__name__)
            raise

    def execute(self, method: str, payload: tuple[tuple, dict[str, Any]]) -> Any:
        """`worker.method(*args, **kwargs)`; errors are logged to the worker's log, then raised."""
        args, kwargs = payload
        try:
            # results another group forwarded (PendingCall.forward) arrive as object references
            args = tuple(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args)
            kwargs = {k: ray.get(v) if isinstance(v, ray.ObjectRef) else v for k, v in kwargs.items()}
            return getattr(self.worker, method)(*args, **kwargs)
        except Exception:
            self.log.exception("%s failed", method)
            raise

    @ray.method(concurrency_group=ALONGSIDE)
    def execute_alongside(self, method: str, payload: tuple[tuple, dict[str, Any]]) -> Any:
        """`execute` on the actor's second thread, while a call may be running on its main thread."""
        return self.execute(method, payload)

    def ping(self) -> bool:
        return True
