"""Worker groups: N copies of a plain Python worker class, run inline (in the controller) or as Ray actors.

The RL loop builds groups with `make_worker_group` and cannot tell the backends apart (design.md, "One
controller, plain workers"). The Ray helpers `init_ray` and `make_placement_group` are importable from here
but load Ray only when first used.
"""

from typing import Any

from ascent.cluster.base import PendingCall, WorkerGroup, find_free_port
from ascent.cluster.errors import ClusterConfigError, WorkerDiedError, WorkerError, WorkerTimeoutError
from ascent.cluster.factory import BACKENDS, make_worker_group

_RAY_NAMES = ("init_ray", "make_placement_group", "RayWorkerGroup")

__all__ = [
    "BACKENDS",
    "ClusterConfigError",
    "PendingCall",
    "RayWorkerGroup",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerTimeoutError",
    "find_free_port",
    "init_ray",
    "make_placement_group",
    "make_worker_group",
]


def __getattr__(name: str) -> Any:
    """Import Ray lazily: `from ascent.cluster import init_ray` costs nothing until Ray is needed."""
    if name in _RAY_NAMES:
        from ascent.cluster import ray_backend  # deferred: Ray, heavy and optional

        return getattr(ray_backend, name)
    raise AttributeError(f"module 'ascent.cluster' has no attribute {name!r}")
