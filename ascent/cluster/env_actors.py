"""Environment hosts as Ray actors (`cluster.backend=ray`): the process hosts' contract, over the cluster.

`RayEnvHosts` is `ascent.envs.hosts.EnvHosts` with Ray actors in place of forkserver processes: each actor
(`EnvActor`) holds environments and answers one command at a time with `ascent.envs.hosts.serve`, the code
the process hosts run, so the runner and the episode logic are the same. Every command gets `timeout_s`
seconds; an actor that times out is killed, one that dies (os._exit, a segfault, an out-of-memory kill, a
lost node) is noticed, and either way its command ends that episode with the reason and the actor is
replaced; the other environments it held end too ("lost with its process"). An exception in user code,
`sys.exit` included, costs the episode only and the actor lives on.

The actors ask for `cpus_per_host` CPUs each, reserved in one placement group of SPREAD strategy, so the
environments of a multi-node run use every node's CPUs (a replacement takes its predecessor's bundle).
Without a count, there are up to 4 per node, as many as the CPUs the workers left free hold. The actors
live for the whole run (created on the first batch, reused by every later one, replaced only when they
fail) and go at `close()`. Each logs to `<run_dir>/logs/env_<i>.log`.

One batch command runs at a time (a lock): episodes played ahead on the collector's thread and validation
on the controller's thread take turns per command, so no command waits behind another batch's and every
deadline measures the environment alone.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ascent.cluster.errors import ClusterConfigError
from ascent.cluster.ray_backend import init_ray, kill_actors, reserve
from ascent.envs.hosts import serve
from ascent.tracking.logs import setup_logging

PER_NODE = 4  # environment actors per node when rollout.env_workers is unset (CPUs permitting)
SETTLE_S = 5.0  # how long free CPUs may take to show in Ray's view after their holder went


class EnvActor:
    """One Ray actor holding environments (not used directly: see `RayEnvHosts`)."""

    def __init__(self, name: str, run_dir: str | None, log_level: str) -> None:
        self.log = setup_logging(run_dir, name, log_level, console=False)
        self.envs: dict[Any, Any] = {}

    def ping(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def handle(self, msg: tuple[str, Any, Any]) -> tuple[str, Any]:
        reply = serve(self.envs, msg)
        if reply[0] == "err":
            self.log.warning("%s %s failed: %s", msg[0], msg[1], reply[1])
        return reply


class RayEnvHosts:
    """`num_hosts` environment actors (None: `default_env_actors`); see the module doc."""

    def __init__(
        self,
        num_hosts: int | None,
        timeout_s: float,
        *,
        cpus_per_host: float = 1.0,
        start_timeout_s: float = 300.0,
        run_dir: str | None = None,
        log_level: str = "INFO",
    ) -> None:
        init_ray()  # a no-op in a run: the worker groups started or joined the cluster
        self.timeout_s, self.cpus, self.start_timeout_s = timeout_s, cpus_per_host, start_timeout_s
        self.run_dir, self.log_level = run_dir, log_level
        n = num_hosts or default_env_actors(cpus_per_host)
        self._group: PlacementGroup | None = _reserve(n, cpus_per_host, start_timeout_s)
        self._actor_cls = ray.remote(EnvActor)
        self._lock = threading.Lock()
        self._actors: list[Any] = []
        try:
            self._actors = [self._start(h) for h in range(n)]
            self._wait_started(list(range(n)))
        except BaseException:
            self.close()
            raise

    # actors ----------------------------------------------------------------------------------------
    def _start(self, h: int) -> Any:
        if self._group is None:
            raise RuntimeError("the environment actors were closed; make a new RayEnvHosts")
        strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=h)
        options = {"num_cpus": self.cpus, "scheduling_strategy": strategy}
        return self._actor_cls.options(**options).remote(f"env_{h}", self.run_dir, self.log_level)

    def _wait_started(self, hosts: list[int], what: str = "did not start") -> None:
        try:
            ray.get([self._actors[h].ping.remote() for h in hosts], timeout=self.start_timeout_s)
        except (GetTimeoutError, RayError) as e:
            raise RuntimeError(
                f"environment actors {hosts} {what} within cluster.worker_timeout_s="
                f"{self.start_timeout_s:g} s ({type(e).__name__}: {str(e).strip().splitlines()[0]}); free "
                f"now: {ray.available_resources()}. Check Ray's logs (/tmp/ray/session_latest/logs)."
            ) from None

    def _replace(self, h: int) -> None:
        ray.kill(self._actors[h], no_restart=True)
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
    def run(self, commands: Sequence[tuple[int, tuple[str, Any, Any]]]) -> list[tuple[str, Any]]:
        """(host, command) pairs -> one reply each, in order; actors run in parallel, each in order."""
        with self._lock:
            return self._run(commands)

    def _run(self, commands: Sequence[tuple[int, tuple[str, Any, Any]]]) -> list[tuple[str, Any]]:
        if self._group is None:
            if all(msg[0] == "drop" for _, msg in commands):  # their environments went with the actors
                return [("ok", 0)] * len(commands)
            raise RuntimeError("the environment actors were closed (after a failure, or by close())")
        queues: dict[int, deque[tuple[int, tuple[str, Any, Any]]]] = {}
        for i, (h, msg) in enumerate(commands):
            queues.setdefault(h, deque()).append((i, msg))
        out: list[tuple[str, Any]] = [("err", "not run")] * len(commands)
        busy: dict[Any, tuple[int, int, float]] = {}  # object ref -> (host, command index, deadline)
        while any(queues.values()) or busy:
            held = {h for h, _, _ in busy.values()}
            for h, q in queues.items():
                if h not in held and q:
                    i, msg = q.popleft()
                    busy[self._actors[h].handle.remote(msg)] = (h, i, time.monotonic() + self.timeout_s)
            soonest = min(deadline for _, _, deadline in busy.values())
            ready, _ = ray.wait(list(busy), num_returns=1, timeout=max(0.0, soonest - time.monotonic()))
            for ref in ready:
                h, i, _ = busy.pop(ref)
                out[i] = self._reply(ref, h)
            now = time.monotonic()
            for ref in [r for r, (_, _, deadline) in busy.items() if now > deadline]:
                h, i, _ = busy.pop(ref)
                if ray.wait([ref], timeout=0)[0]:  # it finished while another actor was being replaced
                    out[i] = self._reply(ref, h)
                else:
                    out[i] = (
                        "err",
                        f"the environment timed out after {self.timeout_s:g} s (its actor was killed)",
                    )
                    self._replace(h)
        return out

    def _reply(self, ref: Any, h: int) -> tuple[str, Any]:
        try:
            reply: tuple[str, Any] = ray.get(ref)
            return reply
        except RayTaskError as e:  # the actor lives; its reply could not travel (e.g. does not pickle)
            return ("err", f"{type(e.cause).__name__}: {e.cause}" if e.cause is not None else _first_line(e))
        except RayError as e:  # the process is gone (os._exit, a signal, OOM, a lost node) or its reply lost
            self._replace(h)
            what = "died" if isinstance(e, RayActorError) else "failed"
            return ("err", f"its environment actor {what} ({_first_line(e)})")

    def close(self) -> None:
        """Kill the actors and free their CPUs. Safe to call twice."""
        kill_actors(self._actors, self._group)
        self._actors, self._group = [], None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else 'no details'}"


def default_env_actors(cpus_per_host: float) -> int:
    """`PER_NODE` actors per alive node, at most as many as the cluster's free CPUs hold."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    free = ray.available_resources().get("CPU", 0.0)
    n = min(PER_NODE * max(1, len(nodes)), int(free / cpus_per_host + 1e-9))
    if n < 1:
        raise ClusterConfigError(
            f"rollout.env_cpus={cpus_per_host:g}: the Ray cluster has {free:g} CPUs free after the workers, "
            "too few for one environment actor. Lower rollout.env_cpus, raise cluster.num_cpus (a local "
            "cluster) or lower cluster.cpus_per_worker, or add nodes."
        )
    return n


def _reserve(n: int, cpus: float, timeout_s: float) -> PlacementGroup:
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
    return reserve(
        [{"CPU": cpus} for _ in range(n)],
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
