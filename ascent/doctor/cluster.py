"""Doctor checks of Ray: installed, the cluster at `cluster.address` reachable, and resources enough for the
placement the config asks for (`ascent.orchestrator.placement.plan_placement`, the same plan the run makes);
`check_placement` prints that plan per component and refuses (exit 2) one this machine cannot hold.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from importlib.metadata import version
from typing import Any

from ascent.config.schema import RunConfig
from ascent.doctor.report import CheckResult, fail, ok, skipped, warn
from ascent.errors import AscentError
from ascent.orchestrator.placement import Demand, demand, demand_shortfall, describe_placement


def tcp_reachable(address: str, timeout_s: float = 5.0) -> str | None:
    """None when a TCP connection to host:port opens, else the error."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return f"{address!r} is not host:port"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as err:
        return str(err) or type(err).__name__


def cluster_resources(address: str) -> dict[str, float]:
    """Connect to the running cluster, read its total resources, disconnect."""
    import ray  # deferred: Ray, heavy and optional

    ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        return dict(ray.cluster_resources())
    finally:
        ray.shutdown()


def local_resources(cfg: RunConfig, gpus_visible: int) -> dict[str, float]:
    """What the local cluster ascent starts would have: cluster.num_cpus (or all CPUs) and the visible
    GPUs."""
    return {"CPU": float(cfg.cluster.num_cpus or os.cpu_count() or 1), "GPU": float(gpus_visible)}


def check_ray(cfg: RunConfig, gpus_visible: int) -> list[CheckResult]:
    c = cfg.cluster
    if c.backend != "ray":
        return [skipped("Ray", "cluster.backend=inline: no Ray needed")]
    if importlib.util.find_spec("ray") is None:
        return [
            fail(
                "Ray",
                "cluster.backend=ray but Ray is not installed",
                "pip install 'ascent[ray]' (ray[default]).",
            )
        ]
    results = [ok("Ray", f"ray {_ray_version()} installed")]
    if c.address and c.address != "auto":
        error = tcp_reachable(c.address)
        if error is not None:
            fix = (
                "start the head first (`ray start --head`; examples/slurm), check this node reaches its "
                "port, or leave cluster.address unset to start a local cluster."
            )
            return [*results, fail("Ray cluster", f"cluster.address={c.address!r}: no answer ({error})", fix)]
    if c.address:
        try:
            total = cluster_resources(c.address)
        except Exception as err:  # Ray raises ConnectionError, RuntimeError, ... when it cannot join
            return [
                *results,
                fail(
                    "Ray cluster",
                    f"cluster.address={c.address!r}: cannot join ({err})",
                    "start the cluster (`ray start --head`) or leave cluster.address unset.",
                ),
            ]
        where = f"cluster at {c.address}"
    else:
        total, where = local_resources(cfg, gpus_visible), "the local cluster ascent would start"
    results.append(ok("Ray cluster", f"{where}: {total.get('CPU', 0):g} CPUs, {total.get('GPU', 0):g} GPUs"))
    return [*results, check_resources(demand(cfg), total, where)]


def check_placement(cfg: RunConfig, gpus_visible: int) -> CheckResult:
    """The GPUs each component asks for (trainer, rollout replicas x tensor_parallel, reward model, judge).

    A local Ray cluster (no cluster.address) has this machine's GPUs: a plan asking more is a config error
    (AscentError, exit 2), as is a replica spanning more GPUs than the node has. A remote cluster's totals
    are `check_ray`'s; inline runs use one device."""
    c, text = cfg.cluster, describe_placement(cfg)
    if c.backend != "ray":
        return ok("placement", f"inline, one device: rollout.tensor_parallel={cfg.rollout.tensor_parallel}")
    if c.address:
        return ok("placement", text)
    need, tp = demand(cfg).gpus, cfg.rollout.tensor_parallel
    if need > gpus_visible or (tp > 1 and tp > gpus_visible):
        raise AscentError(
            f"placement {text}, and this machine has {gpus_visible} GPU(s): lower cluster.num_*_workers, "
            "cluster.gpus_per_worker / trainer_gpus / rollout_gpus / reward_model_gpus or "
            "rollout.tensor_parallel, or join a larger Ray cluster (cluster.address)."
        )
    return ok("placement", text)


def check_resources(need: Demand, total: dict[str, Any], where: str) -> CheckResult:
    name = "Ray resources"
    have_gpu, have_cpu = float(total.get("GPU", 0)), float(total.get("CPU", 0))
    text = (
        f"the workers ask {need.gpus:g} GPUs and {need.cpus:g} CPUs; "
        f"{where} has {have_gpu:g} and {have_cpu:g}"
    )
    short = demand_shortfall(need, total)
    if short is not None:
        return fail(name, text, short)
    if need.one_node and need.gpus > 0:
        return (
            warn(
                name,
                text + "; colocated bundles must fit on ONE node (STRICT_PACK)",
                "check one node has that many GPUs, or use cluster.placement=split.",
            )
            if where != ("the local cluster ascent would start")
            else ok(name, text)
        )
    return ok(name, text)


def _ray_version() -> str:
    return version("ray")


def check_simulator_placement(
    cfg: RunConfig, simulators: list[str], backend: str | None, gpus_visible: int
) -> CheckResult:
    """Where simulator workers go: `rollout.env_workers_per_node` (or `env_workers`) actors on Ray, each
    stepping `rollout.source.sims_per_worker` copies, with `rollout.env_gpus` of a GPU each for rendering
    through EGL. A GPU share without a visible GPU, or without EGL (`backend`: what the simulator rendering
    check found), is a failure: the actors could not be placed, or would render on the CPU anyway."""
    name = "simulator placement"
    r = cfg.rollout
    if not simulators:
        return skipped(name, "no simulator environment in this config")
    copies = getattr(r.source, "sims_per_worker", 0)
    each = f"{copies} copies stepped together each" if copies else "one environment per episode"
    if cfg.cluster.backend != "ray" or r.env_isolation == "inline":
        where = "this process" if r.env_isolation == "inline" else "worker processes on this node"
        gpu_note = f"; rollout.env_gpus={r.env_gpus:g} is read by Ray actors only" if r.env_gpus else ""
        return ok(name, f"simulators in {where} ({each}){gpu_note}", copies=copies)
    count = f"{r.env_workers} in all" if r.env_workers else f"{r.env_workers_per_node} per node"
    if r.env_gpus <= 0:
        return ok(name, f"simulator actors: {count}, on CPUs ({each})", copies=copies)
    per_gpu = 1 / r.env_gpus
    if gpus_visible == 0:
        return fail(
            name,
            f"rollout.env_gpus={r.env_gpus:g} gives simulator actors a GPU share, but no GPU is visible here",
            "set rollout.env_gpus=0 (render on the CPU with MUJOCO_GL=osmesa, or run state-only rows).",
        )
    if backend != "egl":
        return fail(
            name,
            f"rollout.env_gpus={r.env_gpus:g} places simulators on GPUs to render there, but MuJoCo's EGL "
            f"does not render here (found: {backend or 'none'})",
            "install the GPU driver's EGL (libegl1) and set MUJOCO_GL=egl, or set rollout.env_gpus=0.",
        )
    return ok(
        name,
        f"simulator actors: {count}, {per_gpu:g} per GPU rendering through EGL ({each})",
        copies=copies,
        per_gpu=per_gpu,
    )
