"""How many environment (simulator) actors Ray gets without a count: rollout.env_workers_per_node per node,
capped by the free CPUs and, with rollout.env_gpus, the free GPUs (Ray's view faked: no cluster starts)."""

from __future__ import annotations

import pytest

from ascent.cluster import ClusterConfigError, ray_hosts


@pytest.fixture
def two_nodes(monkeypatch):
    nodes = [{"Alive": True, "Resources": {"CPU": 16, "GPU": 2}}] * 2
    monkeypatch.setattr(ray_hosts.ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray_hosts.ray, "available_resources", lambda: {"CPU": 20.0, "GPU": 3.0})


def test_actors_per_node_follow_the_setting_within_the_free_cpus(two_nodes):
    assert ray_hosts.default_env_actors(1.0) == 8  # 4 per node, the default
    assert ray_hosts.default_env_actors(1.0, per_node=6) == 12
    assert ray_hosts.default_env_actors(2.0, per_node=16) == 10  # 20 free CPUs / 2


def test_a_gpu_share_caps_the_actors_by_the_free_gpus(two_nodes):
    assert ray_hosts.default_env_actors(1.0, per_node=16, gpus_per_host=0.25) == 12  # 3 GPUs x 4
    with pytest.raises(ClusterConfigError, match="rollout.env_gpus=4"):
        ray_hosts.default_env_actors(1.0, gpus_per_host=4.0)
