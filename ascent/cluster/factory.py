"""`make_worker_group`: the one way the orchestrator builds a worker group, whatever the backend.

Ray is imported only for `backend="ray"`, so inline runs (tests, debugging) start fast without it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ascent.cluster.base import W, WorkerGroup
from ascent.cluster.errors import ClusterConfigError

if TYPE_CHECKING:  # Ray is imported only when the ray backend starts
    from ray.util.placement_group import PlacementGroup

BACKENDS = ("inline", "ray")


def make_worker_group(
    cls: type[W],
    *,
    num_workers: int,
    backend: Literal["inline", "ray"],
    name: str,
    init_args: Sequence[Any] = (),
    init_kwargs: dict[str, Any] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    num_gpus_per_worker: float = 0.0,
    num_cpus_per_worker: float = 1.0,
    timeout_s: float = 1800.0,
    env: dict[str, str] | None = None,
    placement_group: PlacementGroup | None = None,
    log_level: str = "info",
) -> WorkerGroup[W]:
    """Start `num_workers` instances of `cls(*init_args, **init_kwargs)`, named `name`, on `backend`.

    - inline: one worker in this process (`num_workers` must be 1; use backend="ray" for more).
    - ray: one Ray actor per worker with `num_gpus_per_worker` GPUs and `num_cpus_per_worker` CPUs; logs go to
      `<run_dir>/logs/<name>_<rank>.log`; `placement_group` (from `make_placement_group`) shares GPUs
      between groups (colocated placement).
    `timeout_s` bounds every call (cluster.worker_timeout_s); `env` adds environment variables; `log_level`
    is the Ray workers' log level (tracking.log_level; inline workers log with the controller).
    """
    if backend == "inline":
        from ascent.cluster.inline import InlineWorkerGroup  # deferred: torch, only for inline workers

        if placement_group is not None:
            raise ClusterConfigError(
                f"worker group '{name}': placement_group is a Ray option; backend=inline has none."
            )
        return InlineWorkerGroup(
            cls,
            name=name,
            num_workers=num_workers,
            init_args=init_args,
            init_kwargs=init_kwargs,
            timeout_s=timeout_s,
            env=env,
        )
    if backend == "ray":
        from ascent.cluster.ray_backend import RayWorkerGroup  # deferred: Ray, heavy and optional

        return RayWorkerGroup(
            cls,
            name=name,
            num_workers=num_workers,
            init_args=init_args,
            init_kwargs=init_kwargs,
            run_dir=run_dir,
            num_gpus_per_worker=num_gpus_per_worker,
            num_cpus_per_worker=num_cpus_per_worker,
            timeout_s=timeout_s,
            env=env,
            placement_group=placement_group,
            log_level=log_level,
        )
    raise ClusterConfigError(
        f"cluster.backend={backend!r}: unknown backend; use one of {', '.join(BACKENDS)}."
    )
