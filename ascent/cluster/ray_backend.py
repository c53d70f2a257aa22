"""The Ray backend: each worker is a Ray actor (one process, its own GPUs), on one machine or many.

`init_ray` starts or joins the cluster. `RayWorkerGroup` starts N `RayWorkerHost` actors, learns their nodes,
gives each its rank environment (MASTER_ADDR/MASTER_PORT on rank 0's node) and constructs the user's class
in every actor. Calls wait at most `timeout_s`; the first worker to fail decides the error.

Placement: a group that asks for GPUs gets its own PACK placement group (its GPUs close together). Groups that
share GPUs (colocated: trainer and rollout take turns) pass the same `make_placement_group(...,
placement="colocated")` (STRICT_PACK: one node) and ask for a fraction of a GPU each, e.g. 0.5 for two
groups. On CPU none of this matters.

Each actor runs its calls one at a time on one thread, except those sent with `call_alongside_async`: they run
on a second thread (the actor's `alongside` concurrency group, one at a time), next to the call in progress.

LOCAL_RANK is the index of the worker's GPU among those it sees (0: Ray narrows CUDA_VISIBLE_DEVICES to
the actor's GPUs) and, for CPU workers, its position among the group's workers on its node.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ascent.cluster.base import PendingCall, W, WorkerGroup, rank_env
from ascent.cluster.errors import ClusterConfigError, WorkerDiedError, WorkerError, WorkerTimeoutError
from ascent.cluster.ray_worker import ALONGSIDE, RayWorkerHost
from ascent.errors import AscentError
from ascent.tracking.logs import worker_log_path

_SOURCE_ROOT = Path(__file__).resolve().parents[2]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _make_ascent_importable_by_local_workers() -> None:
    """A source checkout that is not pip-installed: put it on PYTHONPATH for the workers Ray will start."""
    if not (_SOURCE_ROOT / "pyproject.toml").exists():
        return
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(_SOURCE_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(_SOURCE_ROOT), *filter(None, paths)])


def init_ray(
    address: str | None = None,
    num_cpus: int | None = None,
    *,
    temp_dir: str | None = None,
    log_to_driver: bool = True,
) -> None:
    """Join the Ray cluster at `address` (`auto`: the one running on this node), or start a local one with
    `num_cpus` CPUs and its session and spill files under `temp_dir`.

    Does nothing when Ray is already initialized. Nodes of a real cluster need ascent installed. A cluster
    that does not answer is a `ClusterConfigError` naming `cluster.address` and how to fix it.
    """
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {}
    if not address:
        _make_ascent_importable_by_local_workers()
        kwargs["num_cpus"] = num_cpus
        if temp_dir:
            Path(temp_dir).mkdir(parents=True, exist_ok=True)
            kwargs["_temp_dir"] = str(Path(temp_dir).resolve())
    if address and address != "auto":
        _check_reachable(address)  # Ray itself retries an unreachable head for many minutes
    try:
        ray.init(
            # "local": a new cluster even when this machine has one (Ray would join the last `ray start`ed)
            address=address or "local",
            include_dashboard=False,
            ignore_reinit_error=True,
            log_to_driver=log_to_driver,
            **kwargs,
        )
    except ConnectionError as e:
        raise ClusterConfigError(
            f"cluster.address={address!r}: no Ray cluster answered ({e}). Start one first (`ray start "
            "--head` on the head node, `ray start --address=HEAD_IP:6379` on the others; examples/slurm does "
            "both), check that this node reaches the head's port 6379, or leave cluster.address unset to "
            "start a local cluster."
        ) from None
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = kwargs.get("_temp_dir") or "Ray's default ($RAY_TMPDIR/ray, $TMPDIR/ray or /tmp/ray)"
        raise ClusterConfigError(
            f"cluster.ray_temp_dir={temp_dir or 'null'}: Ray could not write its session files under {where} "
            f"({e.strerror}: a full disk or a disk quota); point cluster.ray_temp_dir at a local disk with "
            "room (`ascent doctor` shows its free space), or free space there."
        ) from None


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Raise ClusterConfigError unless a TCP connection to the Ray head at `address` (host:port) opens."""

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return
    except (OSError, ValueError) as e:
        raise ClusterConfigError(
            f"cluster.address={address!r}: the Ray head does not answer ({type(e).__name__}: {e}). Start it "
            "(`ray start --head --port=6379`; examples/slurm does it), check the host and port (a node with "
            "several network interfaces may need `ray start --node-ip-address=...`), or leave "
            "cluster.address unset to start a local cluster."
        ) from None


def make_placement_group(
    num_bundles: int,
    *,
    gpus_per_bundle: float = 1.0,
    cpus_per_bundle: float = 1.0,
    placement: Literal["colocated", "split"] = "colocated",
    timeout_s: float = 300.0,
) -> PlacementGroup:
    """Reserve `num_bundles` bundles of {CPU, GPU}; colocated -> STRICT_PACK (one node), split -> PACK.

    Worker i of each group that gets this placement group runs in bundle i, so a bundle must hold what all
    groups sharing it ask per worker: two colocated groups of 0.5 GPU and 0.5 CPU per worker fit bundles
    of 1 GPU and 1 CPU. STRICT_PACK needs all bundles on one node; for colocated groups across nodes, pass
    `placement="split"` (PACK) and share it all the same.
    """
    bundle = {"CPU": cpus_per_bundle, **({"GPU": gpus_per_bundle} if gpus_per_bundle > 0 else {})}
    strategy = "STRICT_PACK" if placement == "colocated" else "PACK"
    return reserve(
        [dict(bundle) for _ in range(num_bundles)],
        strategy,
        timeout_s,
        lambda: (
            f"placement={placement}: could not reserve {num_bundles} x {bundle} ({strategy}) within "
            f"{timeout_s:g}s; the cluster has {ray.cluster_resources()} in total and "
            f"{ray.available_resources()} free. Use fewer workers or GPUs per worker, or placement=split."
        ),
    )


def reserve(
    bundles: list[dict[str, float]], strategy: str, timeout_s: float, error: Callable[[], str]
) -> PlacementGroup:
    """A placement group of `bundles`, placed within `timeout_s`; else it is removed and ClusterConfigError
    says `error()` (built at that moment, so it can show the cluster's free resources then)."""
    group = placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise ClusterConfigError(error())
    return group


class _RayPending(PendingCall[Any]):
    def __init__(self, group: RayWorkerGroup, method: str, refs: list[Any], ranks: list[int]) -> None:
        self._group, self._method, self._refs, self._ranks = group, method, refs, ranks

    def get(self) -> list[Any]:
        return self._group._gather(self._method, self._refs, self._ranks)

    def forward(self, index: int = 0) -> Any:
        return self._refs[index]  # resolved by the receiving worker (RayWorkerHost.execute)

    def others(self, index: int = 0) -> list[Any]:
        keep = [i for i in range(len(self._refs)) if i != index]
        return self._group._gather(
            self._method, [self._refs[i] for i in keep], [self._ranks[i] for i in keep]
        )


class RayWorkerGroup(WorkerGroup[W]):
    """N Ray actors, each hosting one instance of `cls` (see the module docstring)."""

    backend = "ray"

    def __init__(
        self,
        cls: type[W],
        *,
        name: str,
        num_workers: int,
        init_args: Sequence[Any] = (),
        init_kwargs: dict[str, Any] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        num_gpus_per_worker: float = 0.0,
        num_cpus_per_worker: float = 1.0,
        timeout_s: float = 1800.0,
        env: dict[str, str] | None = None,
        placement_group: PlacementGroup | None = None,
        log_level: str = "INFO",
    ) -> None:
        super().__init__(cls, name=name, num_workers=num_workers, timeout_s=timeout_s)
        init_ray()
        self.run_dir = str(run_dir) if run_dir is not None else None
        self.num_gpus_per_worker, self.num_cpus_per_worker = num_gpus_per_worker, num_cpus_per_worker
        self._own_placement_group: PlacementGroup | None = None
        self._actors: list[Any] = []
        try:
            self._actors = self._start_actors(placement_group, log_level)
            infos = self._wait_started()
            refs = [
                actor.init_worker.remote(
                    cls, self._rank_env(rank, infos, env), tuple(init_args), init_kwargs or {}
                )
                for rank, actor in enumerate(self._actors)
            ]
            self._gather(f"{cls.__name__}.__init__", refs, list(range(num_workers)))
        except BaseException:
            self.shutdown()
            raise

    # start-up --------------------------------------------------------------------------------------
    def _check_resources(self) -> None:
        total = ray.cluster_resources()
        for key, per_worker in (("CPU", self.num_cpus_per_worker), ("GPU", self.num_gpus_per_worker)):
            need = per_worker * self.num_workers
            if need > total.get(key, 0.0):
                raise ClusterConfigError(
                    f"worker group '{self.name}': {self.num_workers} workers x {per_worker:g} {key} = "
                    f"{need:g} {key}, but the Ray cluster has {total.get(key, 0.0):g} {key}. Use fewer "
                    "workers or less per worker (cluster.gpus_per_worker, cluster.num_*_workers), or add "
                    "nodes."
                )

    def _start_actors(self, group: PlacementGroup | None, log_level: str) -> list[Any]:
        if group is None:
            self._check_resources()
            if self.num_gpus_per_worker > 0:
                group = self._own_placement_group = make_placement_group(
                    self.num_workers,
                    gpus_per_bundle=self.num_gpus_per_worker,
                    cpus_per_bundle=self.num_cpus_per_worker,
                    placement="split",
                    timeout_s=self.timeout_s,
                )
        # a second thread for call_alongside_async (the stubs do not list ray.remote's actor options)
        actor_cls = ray.remote(  # type: ignore[call-overload]
            concurrency_groups={ALONGSIDE: 1}
        )(RayWorkerHost)
        actors = []
        for rank in range(self.num_workers):
            options: dict[str, Any] = {
                "num_cpus": self.num_cpus_per_worker,
                "num_gpus": self.num_gpus_per_worker,
            }
            if group is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=rank % group.bundle_count
                )
            actors.append(actor_cls.options(**options).remote(self.name, rank, self.run_dir, log_level))
        return actors

    def _wait_started(self) -> list[dict[str, Any]]:
        try:
            return self._gather(
                "start", [a.node_info.remote() for a in self._actors], list(range(self.num_workers))
            )
        except WorkerTimeoutError as e:
            raise RuntimeError(
                f"worker group '{self.name}': ranks {e.pending_ranks} did not start within "
                f"{self.timeout_s:g}s; Ray has no room for them ({self.num_cpus_per_worker:g} CPU, "
                f"{self.num_gpus_per_worker:g} "
                f"GPU each; free now: {ray.available_resources()}). Other groups may hold the resources."
            ) from None

    def _rank_env(
        self, rank: int, infos: list[dict[str, Any]], extra: dict[str, str] | None
    ) -> dict[str, str]:
        node = infos[rank]["node_id"]
        same_node = [r for r, info in enumerate(infos) if info["node_id"] == node]
        gpu_ids = infos[rank]["gpu_ids"]
        if gpu_ids:
            noset = os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")
            local_rank = int(gpu_ids[0]) if noset else 0
        else:
            local_rank = same_node.index(rank)
        return rank_env(
            rank=rank,
            world_size=self.num_workers,
            local_rank=local_rank,
            local_world_size=len(same_node),
            master_addr=infos[0]["ip"],
            master_port=infos[0]["free_port"],
            extra=extra,
        )

    # calls -----------------------------------------------------------------------------------------
    def log_path(self, rank: int) -> Path | None:
        """The log file of worker `rank` (None without a run_dir)."""
        return worker_log_path(self.run_dir, f"{self.name}_{rank}") if self.run_dir else None

    def _submit(
        self, method: str, calls: Sequence[tuple[int, tuple, dict]], alongside: bool = False
    ) -> PendingCall[Any]:
        if not self._actors:
            raise RuntimeError(f"worker group '{self.name}' is shut down; {method} cannot run.")
        first = calls[0]
        shared = len(calls) > 1 and all(c[1] is first[1] and c[2] is first[2] for c in calls)
        shared_payload = ray.put((first[1], first[2])) if shared else None  # one copy for all workers
        entry = "execute_alongside" if alongside else "execute"
        refs = [
            getattr(self._actors[rank], entry).remote(method, shared_payload if shared else (args, kwargs))
            for rank, args, kwargs in calls
        ]
        return _RayPending(self, method, refs, [rank for rank, _, _ in calls])

    def _gather(self, method: str, refs: list[Any], ranks: list[int]) -> list[Any]:
        """Results in order; the first failure (or the deadline) raises."""
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            timeout = max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                raise WorkerTimeoutError(
                    self.name, method, self.timeout_s, sorted(ranks[index[r]] for r in pending)
                )
            i = index[ready[0]]
            results[i] = self._get_one(ready[0], method, ranks[i])
        return results

    def _get_one(self, ref: Any, method: str, rank: int) -> Any:
        try:
            return ray.get(ref)
        except RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else None
            if isinstance(cause, AscentError):
                raise cause from None  # a user error: its message already names the field and the fix
            error = f"{type(cause).__name__}: {cause}" if cause is not None else str(e).splitlines()[-1]
            details = "Worker traceback:\n" + _ANSI.sub("", str(e))
            raise WorkerError(
                self.name, rank, method, error, log_path=self.log_path(rank), details=details
            ) from cause
        except RayError as e:  # RayActorError (actor died), OutOfMemoryError, NodeDiedError, ...
            reason = (
                f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'no details'}"
            )
            raise WorkerDiedError(self.name, rank, method, reason, log_path=self.log_path(rank)) from e

    def shutdown(self) -> None:
        kill_actors(self._actors, self._own_placement_group)
        self._actors, self._own_placement_group = [], None


def kill_actors(actors: list[Any], group: PlacementGroup | None) -> None:
    """Kill `actors` (no restarts) and remove the placement group they held, if any."""
    for actor in actors:
        ray.kill(actor, no_restart=True)
    if group is not None:
        remove_placement_group(group)
