"""Hosts as Ray actors (`cluster.backend=ray`): `ascent.cluster.hosts`' scheduler and policy, over the cluster.

`RayHosts` is `ascent.cluster.hosts.ProcessHosts` with Ray actors in place of forkserver processes: each actor
(`HostActor`) holds state and answers one command at a time with `ascent.envs.hosts.serve`, the code every
host runs, and the scheduler, the timeout and the failure texts are `HostPool`'s. An actor that times out
is killed, one that dies (os._exit, a segfault, an out-of-memory kill, a lost node) is noticed, and either
way it is replaced; an exception in user code, `sys.exit` included, costs that command only. A replacement
that cannot start is an error, and every actor goes with it (no later command waits behind work abandoned
on the others). Environments run here today; rewards and agents run on process hosts on the controller.

The actors ask for `cpus_per_host` CPUs each (and `gpus_per_host`, a share of a GPU, for simulators that
render through EGL: `rollout.env_gpus`), reserved in one placement group of SPREAD strategy, so the
environments of a multi-node run use every node's CPUs (a replacement takes its predecessor's bundle).
Without a count, there are up to `per_node` per node (`rollout.env_workers_per_node`, default 4), as many
as the CPUs (and GPUs) the workers left free hold. The actors
live for the whole run (created on the first batch, reused by every later one, replaced only when they
fail) and go at `close()`. Each logs to `<run_dir>/logs/env_<i>.log`.

One run of commands at a time (`HostPool`'s lock): episodes played ahead on the collector's thread and
validation on the controller's thread take turns, so every deadline measures the user code alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ascent.cluster.confine import CappedOutput, limit_memory
from ascent.cluster.errors import ClusterConfigError
from ascent.cluster.hosts import HostPool, IsolationPolicy
from ascent.cluster.ray_backend import init_ray, kill_actors, reserve
from ascent.envs.hosts import Command, serve
from ascent.messages import Outcome
from ascent.tracking.logs import setup_logging

PER_NODE = 4  # environment actors per node when rollout.env_workers is unset (rollout.env_workers_per_node)
SETTLE_S = 5.0  # how long free CPUs may take to show in Ray's view after their holder went


class HostActor:
    """One Ray actor holding state for commands (not used directly: see `RayHosts`), its memory and output
    capped as a process host's are (`ascent.cluster.confine`; what a call prints past its cap is logged)."""

    def __init__(self, name: str, run_dir: str | None, log_level: str, policy: IsolationPolicy) -> None:
        self.log = setup_logging(run_dir, name, log_level, console=False)
        self.policy = policy
        limit_memory(policy.memory_mb)
        self.output = CappedOutput()
        self.state: dict[Any, Any] = {}

    def ping(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def handle(self, command: Command) -> Outcome:
        outcome = self.policy.noted(serve(self.state, command))
        for overflow in self.output.end_call():
            self.log.warning("%s", overflow.describe(f"{self.policy.what} actor {os.getpid()}"))
        if not outcome.ok:
            self.log.warning("%s failed: %s", command[0], outcome.error)
        return outcome


class RayHosts(HostPool):
    """`num_hosts` host actors (None: `default_env_actors`) under `policy`; see the module doc."""

    host = "actor"

    def __init__(
        self,
        num_hosts: int | None,
        policy: IsolationPolicy,
        *,
        cpus_per_host: float = 1.0,
        gpus_per_host: float = 0.0,
        per_node: int = PER_NODE,
        start_timeout_s: float = 300.0,
        run_dir: str | None = None,
        log_level: str = "INFO",
    ) -> None:
        super().__init__(policy)
        init_ray()  # a no-op in a run: the worker groups started or joined the cluster
        self.cpus, self.gpus, self.start_timeout_s = cpus_per_host, gpus_per_host, start_timeout_s
        self.run_dir, self.log_level = run_dir, log_level
        n = num_hosts or default_env_actors(cpus_per_host, per_node, gpus_per_host)
        self._group: PlacementGroup | None = _reserve(n, cpus_per_host, start_timeout_s, gpus_per_host)
        self._actor_cls = ray.remote(HostActor)
        self._actors: list[Any] = []
        self._refs: dict[int, Any] = {}  # host -> the object ref of its command in progress
        try:
            self._actors = [self._start(h) for h in range(n)]
            self._wait_started(list(range(n)))
        except BaseException:
            self.close()
            raise

    # actors ----------------------------------------------------------------------------------------
    def _open(self) -> None:
        """Nothing: the actors start in `__init__`, so a count or a size that cannot fit is refused at once."""

    def _start(self, h: int) -> Any:
        if self._group is None:
            raise RuntimeError("the host actors were closed; make a new RayHosts")
        strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=h)
        options = {"num_cpus": self.cpus, "num_gpus": self.gpus, "scheduling_strategy": strategy}
        return self._actor_cls.options(**options).remote(
            f"env_{h}", self.run_dir, self.log_level, self.policy
        )

    def _wait_started(self, hosts: list[int], what: str = "did not start") -> None:
        try:
            ray.get([self._actors[h].ping.remote() for h in hosts], timeout=self.start_timeout_s)
        except (GetTimeoutError, RayError) as e:
            raise RuntimeError(
                f"{self.policy.what} actors {hosts} {what} within cluster.worker_timeout_s="
                f"{self.start_timeout_s:g} s ({type(e).__name__}: {str(e).strip().splitlines()[0]}); free "
                f"now: {ray.available_resources()}. Check Ray's logs (/tmp/ray/session_latest/logs)."
            ) from None

    def _replace(self, h: int) -> None:
        ray.kill(self._actors[h], no_restart=True)
        self._refs.pop(h, None)
        try:
            self._actors[h] = self._start(h)
            self._wait_started([h], "(replacing one that died or timed out) did not start")
        except BaseException:
            self.close()  # every actor goes: no later command waits behind work abandoned on the others
            raise

    @property
    def num_hosts(self) -> int:
        return len(self._actors)

    def node_ids(self) -> list[str]:
        """The node of each actor, in host order."""
        return list(ray.get([a.ping.remote() for a in self._actors], timeout=self.start_timeout_s))

    # commands --------------------------------------------------------------------------------------
    def run(self, commands: Sequence[tuple[int | None, Command]], detail: str = "") -> list[Outcome]:
        if self._group is None:
            if all(c[0] == "drop" for _, c in commands):  # their environments went with the actors
                return [Outcome(value=0)] * len(commands)
            raise RuntimeError(f"the {self.policy.what} actors were closed (after a failure, or by close())")
        return super().run(commands, detail)

    def _submit(self, h: int, command: Command) -> Outcome | None:
        try:
            self._refs[h] = self._actors[h].handle.remote(command)
        except Exception as e:  # noqa: BLE001 - e.g. a command that does not pickle
            return Outcome(error=f"{command[0]} cannot be sent to its actor ({type(e).__name__}: {e})")
        return None

    def _ready(self, hosts: list[int], timeout: float) -> list[int]:
        refs = {self._refs[h]: h for h in hosts}
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout)
        if ready:  # and whatever else is done by now
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        return sorted(refs[r] for r in ready)

    def _answer(self, h: int, op: str) -> Outcome:
        ref = self._refs.pop(h)
        try:
            outcome: Outcome = ray.get(ref)
            return outcome
        except RayTaskError as e:  # the actor lives; its answer could not travel (e.g. does not pickle)
            return Outcome(
                error=f"{type(e.cause).__name__}: {e.cause}" if e.cause is not None else _first_line(e)
            )
        except RayError as e:  # the process is gone (os._exit, a signal, OOM, a lost node) or its answer lost
            return self._died(h, _first_line(e), op)

    def close(self) -> None:
        """Kill the actors and free their CPUs. Safe to call twice."""
        kill_actors(self._actors, self._group)
        self._actors, self._group, self._refs = [], None, {}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else 'no details'}"


def default_env_actors(cpus_per_host: float, per_node: int = PER_NODE, gpus_per_host: float = 0.0) -> int:
    """`per_node` actors per alive node, at most as many as the cluster's free CPUs (and GPUs) hold."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    available = ray.available_resources()
    free = available.get("CPU", 0.0)
    n = min(per_node * max(1, len(nodes)), int(free / cpus_per_host + 1e-9))
    if gpus_per_host > 0:
        n = min(n, int(available.get("GPU", 0.0) / gpus_per_host + 1e-9))
        if n < 1:
            raise ClusterConfigError(
                f"rollout.env_gpus={gpus_per_host:g}: the Ray cluster has {available.get('GPU', 0.0):g} "
                "GPUs free after the workers, too few for one simulator actor. Lower rollout.env_gpus (0: "
                "render on the CPU with MUJOCO_GL=osmesa, or state-only rows), or add GPU nodes."
            )
    if n < 1:
        raise ClusterConfigError(
            f"rollout.env_cpus={cpus_per_host:g}: the Ray cluster has {free:g} CPUs free after the workers, "
            "too few for one environment actor. Lower rollout.env_cpus, raise cluster.num_cpus (a local "
            "cluster) or lower cluster.cpus_per_worker, or add nodes."
        )
    return n


def _reserve(n: int, cpus: float, timeout_s: float, gpus: float = 0.0) -> PlacementGroup:
    """`n` bundles of `cpus` CPUs, spread over the nodes; a clear error when the cluster cannot hold them."""
    need, total = n * cpus, ray.cluster_resources().get("CPU", 0.0)
    fix = (
        "Use fewer environment actors (rollout.env_workers) or fewer CPUs each (rollout.env_cpus), raise "
        "cluster.num_cpus (a local cluster), or add nodes."
    )
    if need > total + 1e-9:
        raise ClusterConfigError(
            f"rollout.env_workers={n} x rollout.env_cpus={cpus:g} = {need:g} CPUs, but the Ray cluster has "
            f"{total:g} CPUs in all. {fix}"
        )
    free = _free_cpus(need)
    if need > free + 1e-9:
        raise ClusterConfigError(
            f"rollout.env_workers={n} x rollout.env_cpus={cpus:g} = {need:g} CPUs, but the Ray cluster has "
            f"{free:g} CPUs free after the workers (cluster.cpus_per_worker each). {fix}"
        )
    bundle = {"CPU": cpus} | ({"GPU": gpus} if gpus > 0 else {})
    return reserve(
        [dict(bundle) for _ in range(n)],
        "SPREAD",
        timeout_s,
        lambda: (
            f"rollout.env_workers={n}: could not place {n} x {cpus:g} CPUs for the environment actors "
            f"within cluster.worker_timeout_s={timeout_s:g} s (no node may have {cpus:g} CPUs free); free "
            f"now: {ray.available_resources()}. {fix}"
        ),
    )


def _free_cpus(need: float) -> float:
    """The cluster's free CPUs, once they reach `need` or after SETTLE_S: Ray's view of what is free lags
    a moment behind actors and placement groups that have just gone."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        free: float = ray.available_resources().get("CPU", 0.0)
        if free + 1e-9 >= need or time.monotonic() > deadline:
            return free
        time.sleep(0.2)
