"""Environment actors on a two-node local Ray cluster (`ray.cluster_utils.Cluster`: two raylets on this
machine, 1 and 2 CPUs): by default they fill the free CPUs and spread over both nodes; a count or a size
that cannot fit is refused at once, naming the fields to change. (Their episode contract, hangs and crashes
included, is tested with the process hosts' tests in tests/unit/envs/test_hosts.py.)"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from ascent.cluster import ClusterConfigError
from ascent.cluster.hosts import IsolationPolicy
from ascent.envs.hosts import drop

POLICY = IsolationPolicy("environment", 10, "rollout.env_timeout_s")


@pytest.fixture(scope="module")
def two_nodes():
    """The cluster's files, its address file included, under a directory of its own (RAY_TMPDIR): Ray's
    `ray.init()` without an address joins the cluster named in /tmp/ray, and nothing else on this machine
    should join this one."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # a single-node cluster left by another test module: this one needs its own
        ray.shutdown()
    saved, own = os.environ.get("RAY_TMPDIR"), tempfile.mkdtemp(prefix="ray")
    os.environ["RAY_TMPDIR"] = own
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=2)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
        ray.shutdown()
        cluster.shutdown()
    finally:
        if saved is None:
            del os.environ["RAY_TMPDIR"]
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(own, ignore_errors=True)


def test_default_actors_fill_the_free_cpus_of_every_node(two_nodes) -> None:
    from ascent.cluster.ray_hosts import RayHosts

    hosts = RayHosts(None, POLICY, cpus_per_host=1.0, start_timeout_s=60)
    try:
        assert hosts.num_hosts == 3  # 4 per node, capped by the 3 free CPUs
        nodes = hosts.node_ids()
        assert len(set(nodes)) == 2  # both nodes run environments
        ok = hosts.run([(h, ("drop", drop, ("none",))) for h in range(3)])
        assert [o.value for o in ok] == [0] * 3
    finally:
        hosts.close()


def test_actors_that_cannot_fit_are_refused_naming_the_fields(two_nodes) -> None:
    from ascent.cluster.ray_hosts import RayHosts

    with pytest.raises(
        ClusterConfigError,
        match=r"rollout.env_workers=4 x rollout.env_cpus=1 = 4 CPUs, but the "
        r"Ray cluster has 3 CPUs in all",
    ):
        RayHosts(4, POLICY, cpus_per_host=1.0)
    with pytest.raises(ClusterConfigError, match=r"rollout.env_cpus=8: .* too few for one environment actor"):
        RayHosts(None, POLICY, cpus_per_host=8.0)
    held = RayHosts(2, POLICY, cpus_per_host=1.0)  # as the trainer and rollout workers would
    try:
        with pytest.raises(ClusterConfigError, match=r"has 1 CPUs free after the workers"):
            RayHosts(2, POLICY, cpus_per_host=1.0)
    finally:
        held.close()
    RayHosts(3, POLICY, cpus_per_host=1.0).close()  # nothing refused or closed kept its CPUs
