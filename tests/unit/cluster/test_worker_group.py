"""Inline and Ray worker groups behave the same on a toy counter (Ray: 2 workers on a 2-CPU local cluster)."""

from __future__ import annotations

import os

import pytest

from ascent.cluster import (
    ClusterConfigError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    make_worker_group,
)
from tests.unit.cluster.workers import BrokenInit, Counter

BACKENDS = ["inline", "ray"]
NUM_WORKERS = {"inline": 1, "ray": 2}


@pytest.fixture(scope="module")
def restore_env():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def make(request: pytest.FixtureRequest, backend: str, cls: type = Counter, **kwargs):
    """A group of `cls` on `backend` (half a CPU per Ray worker, so several groups fit on 2 CPUs)."""
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    else:
        request.getfixturevalue("restore_env")
    kwargs.setdefault("num_workers", NUM_WORKERS[backend])
    kwargs.setdefault("name", f"{cls.__name__.lower()}_{backend}")
    kwargs.setdefault("num_cpus_per_worker", 0.5)
    return make_worker_group(cls, backend=backend, **kwargs)


@pytest.fixture(scope="module", params=BACKENDS)
def group(request, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp(f"run_{request.param}")
    g = make(request, request.param, init_args=(5,), init_kwargs={"step": 2}, run_dir=run_dir)
    g.test_run_dir = run_dir
    yield g
    g.shutdown()


def test_call_returns_results_in_rank_order(group):
    before = group.call(Counter.get)
    assert len(before) == group.num_workers
    assert [b - before[0] for b in before] == [100 * r for r in range(group.num_workers)]
    assert group.call(Counter.add, 3) == [b + 3 for b in before]
    assert group.call(Counter.add) == [b + 5 for b in before]  # init_kwargs step=2


def test_call_split_gives_each_worker_its_shard(group):
    before = group.call(Counter.get)
    shards = [[rank + 1, rank + 1] for rank in range(group.num_workers)]
    after = group.call_split(Counter.add_all, shards, scale=10)
    assert after == [b + 10 * 2 * (r + 1) for r, b in enumerate(before)]


def test_call_split_needs_one_shard_per_worker(group):
    with pytest.raises(
        ValueError, match=f"got {group.num_workers + 1} shards for {group.num_workers} workers"
    ):
        group.call_split(Counter.add_all, [[1]] * (group.num_workers + 1))


def test_rank_env_is_set_before_construction(group):
    envs = group.call(Counter.env)
    n = group.num_workers
    assert [e["RANK"] for e in envs] == [str(r) for r in range(n)]
    assert {e["WORLD_SIZE"] for e in envs} == {str(n)}
    assert [e["LOCAL_RANK"] for e in envs] == [str(r) for r in range(n)]  # one node, CPU workers
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert 0 < int(envs[0]["MASTER_PORT"]) < 65536


def test_call_rank0_and_async(group):
    assert group.call_rank0(Counter.env, "RANK") == {"RANK": "0"}
    pending = group.call_async(Counter.get)
    assert pending.get() == group.call(Counter.get)


def test_worker_exception_propagates_with_its_message(group):
    last = group.num_workers - 1
    with pytest.raises(WorkerError, match="no such key") as info:
        group.call(Counter.fail_on_rank, last, "no such key")
    assert info.value.rank == last
    assert "KeyError" in str(info.value) and group.name in str(info.value)
    with pytest.raises(WorkerError, match="ValueError: rank 0: boom"):
        group.call_rank0(Counter.fail, "boom")
    assert len(group.call(Counter.get)) == group.num_workers  # the workers survive an exception


def test_a_method_of_another_class_or_a_string_is_a_clear_error(group):
    """Calls name the worker class's method itself; anything else fails before it is sent."""
    for wrong in (BrokenInit.get, "get", Counter._private, lambda self: 0):
        with pytest.raises(AttributeError, match="is not a public method of Counter"):
            group.call(wrong)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", BACKENDS)
def test_constructor_error_names_the_worker(request, backend):
    with pytest.raises(WorkerError, match="BrokenInit.__init__ raised RuntimeError: no model") as info:
        make(request, backend, BrokenInit)
    assert str(info.value).splitlines()[0].endswith("no model at /nonexistent")


@pytest.mark.parametrize("backend", BACKENDS)
def test_call_timeout(request, backend):
    with make(request, backend, num_workers=1, name="sleepy") as g:
        g.timeout_s = 1.0  # after start-up, which on Ray takes about a second
        with pytest.raises(WorkerTimeoutError) as info:
            g.call(Counter.sleep, 30)
    message = str(info.value)
    for part in ("'sleepy'", "sleep", "1s", "cluster.worker_timeout_s", "NCCL_SOCKET_IFNAME"):
        assert part in message
    assert info.value.pending_ranks == [0]


def test_inline_runs_one_worker_only(request):
    with pytest.raises(ValueError, match="cluster.backend=ray"):
        make(request, "inline", num_workers=2)


def test_unknown_backend():
    with pytest.raises(ValueError, match="cluster.backend='slurm'"):
        make_worker_group(Counter, num_workers=1, backend="slurm", name="x")


def test_inline_worker_runs_in_this_process(request):
    with make(request, "inline", init_args=(7,)) as g:
        assert g.worker.value == 7
        assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"


def test_ray_worker_logs_to_its_file(group):
    if group.backend != "ray":
        pytest.skip("per-worker log files are a Ray feature (inline workers use the controller's log)")
    with pytest.raises(WorkerError) as info:
        group.call(Counter.fail_on_rank, 1, "logged failure")
    log_file = group.test_run_dir / "logs" / f"{group.name}_1.log"
    assert str(log_file) in str(info.value)
    assert "logged failure" in log_file.read_text()


def test_ray_worker_death_points_at_its_log(request, tmp_path):
    g = make(request, "ray", num_workers=1, name="crasher", run_dir=tmp_path)
    with g, pytest.raises(WorkerDiedError) as info:
        g.call(Counter.crash)
    message = str(info.value)
    assert "'crasher' rank 0 died during crash" in message
    assert str(tmp_path / "logs" / "crasher_0.log") in message


def test_ray_asks_for_more_than_the_cluster_has(request):
    with pytest.raises(ValueError, match="but the Ray cluster has 2 CPU"):
        make(request, "ray", num_workers=2, num_cpus_per_worker=4, name="greedy")


def test_ray_colocated_groups_share_a_placement_group(request):
    request.getfixturevalue("ray_cluster")
    from ray.util.placement_group import remove_placement_group

    from ascent.cluster import make_placement_group

    bundle = make_placement_group(1, gpus_per_bundle=0.0, cpus_per_bundle=1.0, placement="colocated")
    try:
        groups = [
            make(request, "ray", num_workers=1, name=name, num_cpus_per_worker=0.5, placement_group=bundle)
            for name in ("trainer", "rollout")
        ]
        assert [g.call(Counter.get) for g in groups] == [[0], [0]]
        for g in groups:
            g.shutdown()
    finally:
        remove_placement_group(bundle)


def test_worker_groups_shutdown_frees_the_shared_placement_group(request):
    """A second build in one process (a benchmark, a sweep) must find the bundles free again: on one GPU a
    leaked bundle made the next build wait forever."""
    request.getfixturevalue("ray_cluster")
    from ray.util import placement_group_table

    from ascent.cluster import make_placement_group
    from ascent.orchestrator.setup import WorkerGroups

    bundle = make_placement_group(1, gpus_per_bundle=0.0, cpus_per_bundle=0.2, placement="colocated")
    trainer, rollout = (
        make(request, "ray", num_workers=1, name=name, num_cpus_per_worker=0.1, placement_group=bundle)
        for name in ("trainer", "rollout")
    )
    assert placement_group_table(bundle)["state"] == "CREATED"
    WorkerGroups(rollout=rollout, trainer=trainer, critic=None, placement_group=bundle).shutdown()
    assert placement_group_table(bundle)["state"] == "REMOVED"


def test_a_placement_group_not_placed_in_time_is_removed_and_named(request):
    """Bundles the cluster cannot hold are not left pending (they would hold the next build): the group is
    removed and the error is the caller's, built when the wait ends."""
    request.getfixturevalue("ray_cluster")
    from ray.util import placement_group_table

    from ascent.cluster import ClusterConfigError
    from ascent.cluster.ray_backend import reserve

    before = set(placement_group_table())
    with pytest.raises(ClusterConfigError, match="^3 CPUs in one bundle: no such node$"):
        reserve([{"CPU": 3.0}], "PACK", 0.5, lambda: "3 CPUs in one bundle: no such node")
    new = [pg for key, pg in placement_group_table().items() if key not in before]
    assert [pg["state"] for pg in new] == ["REMOVED"]


def test_inline_timeout_waits_while_a_debugger_is_stopped(request, monkeypatch):
    from ascent.cluster import inline

    monkeypatch.setattr(inline, "_debugger_active", lambda: True)
    monkeypatch.setattr(inline, "_DEBUGGER_RECHECK_S", 0.1)
    with make(request, "inline", timeout_s=0.2) as g:
        assert g.call(Counter.sleep, 0.6) == [0.6]


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_errors_keep_their_type(request, backend):
    from ascent.errors import AscentError
    from tests.unit.cluster.workers import UserErrorInit

    with pytest.raises(AscentError, match=r"^model.path='/nope': no such directory"):
        make(request, backend, UserErrorInit, init_args=("/nope",))


def test_an_unreachable_ray_head_is_refused_at_once_naming_the_field():
    """Ray retries an unreachable head for many minutes; ascent probes it first and names cluster.address."""
    pytest.importorskip("ray")
    import socket
    import time

    from ascent.cluster.errors import ClusterConfigError
    from ascent.cluster.ray_backend import _check_reachable

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(
        ClusterConfigError, match=rf"cluster.address='127.0.0.1:{port}': the Ray head does not"
    ):
        _check_reachable(f"127.0.0.1:{port}")  # what init_ray runs before ray.init
    assert time.monotonic() - t0 < 15


def test_forward_hands_a_result_to_another_group_without_the_controller(request, group):
    """Result i of one call becomes an argument of another group's call (Ray: an object reference the
    receiving worker resolves; inline: the value); `others` collects the rest."""
    other = make(request, group.backend, num_workers=group.num_workers, name=f"receiver_{group.backend}")
    with other:
        before = other.call(Counter.get)
        pending = group.call_async(Counter.get)
        sent = group.call(Counter.get)[0]
        assert other.call(Counter.add, pending.forward(0)) == [b + sent for b in before]
        assert pending.others(0) == group.call(Counter.get)[1:]


def test_a_plan_whose_groups_only_fit_one_at_a_time_is_refused_before_any_actor(request):
    """Trainer and rollout each fit the 2-CPU cluster alone but not together: without the up-front check
    the second group waited for CPUs forever."""
    request.getfixturevalue("ray_cluster")
    from ascent.cluster.errors import ClusterConfigError
    from ascent.config import load_config
    from ascent.orchestrator.setup import build_worker_groups

    cfg = load_config(
        None,
        [
            "model.path=unused",
            "data.train_path=unused",
            "cluster.backend=ray",
            "cluster.placement=split",
            "cluster.cpus_per_worker=2",
        ],
    )
    with pytest.raises(ClusterConfigError, match=r"ask 4 CPUs .* has 2.*cluster.cpus_per_worker"):
        build_worker_groups(cfg)


def test_an_alongside_call_runs_next_to_the_call_in_progress(request, group):
    """On Ray a call sent with call_alongside_async runs while the worker is busy with an earlier call (here:
    one that waits for it), where a plain call would queue behind it; inline there is nothing to run next to,
    so it is an ordinary call."""
    if group.backend == "inline":
        assert group.call_alongside_async(Counter.set_flag).get() == [0]
        assert group.call(Counter.wait_for_flag, 0.0) == [True]
        return
    busy = group.call_async(Counter.wait_for_flag, 60.0)
    assert group.call_alongside_async(Counter.set_flag).get() == list(range(group.num_workers))
    assert busy.get() == [True] * group.num_workers  # released by the alongside call, not by the timeout
    assert group.call(Counter.get)  # the main thread serves ordinary calls again


def test_a_full_disk_or_quota_under_rays_temp_dir_names_cluster_ray_temp_dir(monkeypatch, tmp_path):
    import errno

    from ascent.cluster import ray_backend

    def init(**kwargs):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(ray_backend.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_backend, "_make_ascent_importable_by_local_workers", lambda: None)
    monkeypatch.setattr(ray_backend.ray, "init", init)
    with pytest.raises(ClusterConfigError) as err:
        ray_backend.init_ray(temp_dir=str(tmp_path / "ray"))
    assert f"cluster.ray_temp_dir={tmp_path / 'ray'}" in str(err.value) and "Disk quota exceeded" in str(
        err.value
    )
    assert "point cluster.ray_temp_dir at a local disk with room" in str(err.value)
