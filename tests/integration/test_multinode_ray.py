"""A run across several Ray nodes: a local multi-node cluster (`ray.cluster_utils.Cluster`: one raylet per
"node", each with 1 CPU) joined through `cluster.address`, so the two FSDP trainer ranks and the rollout
replica must each land on a different node. Rank 1 finds rank 0's rendezvous through the node address the
group hands out, local ranks are counted per node, and the run ends where one unsharded trainer rank ends."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import ascent, run_config, write_yaml
from safetensors.torch import load_file

START = re.compile(r"starting (\w+) \(rank (\d) of (\d)\) on node (\w+) \(local rank (\d) of (\d)\)")


@pytest.fixture
def three_nodes():
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def _starts(run_dir) -> dict[str, tuple[str, ...]]:
    out = {}
    for log in (run_dir / "logs").glob("*_*.log"):
        m = START.search(log.read_text())
        if m:
            out[log.stem] = m.groups()
    return out


def _final_weights(run_dir) -> dict[str, torch.Tensor]:
    last = sorted((run_dir / "checkpoints").glob("iter_*"))[-1]
    return load_file(str(last / "model.safetensors"))


@pytest.mark.slow
def test_fsdp_ranks_and_replica_on_three_nodes_match_one_node(
    tmp_path, tiny_model, arithmetic_data, three_nodes
):
    cfg = run_config(tmp_path / "multi", tiny_model, arithmetic_data, iterations=2, val_every=0)
    cfg["cluster"] = {
        "backend": "ray",
        "address": three_nodes.address,
        "num_trainer_workers": 2,
        "cpus_per_worker": 1,
    }
    cfg["train"]["sharding"] = "fsdp"
    cfg["checkpoint"] = {"every": 0}
    ascent("train", str(write_yaml(tmp_path / "multi.yaml", cfg)), timeout=600)
    starts = _starts(tmp_path / "multi" / "run")
    assert set(starts) == {"trainer_0", "trainer_1", "rollout_0"}, starts
    assert len({s[3] for s in starts.values()}) == 3  # three different nodes
    assert all(s[4:] == ("0", "1") for s in starts.values())  # alone on its node: local rank 0 of 1
    multi = _final_weights(tmp_path / "multi" / "run")

    one = run_config(tmp_path / "one", tiny_model, arithmetic_data, iterations=2, val_every=0)
    one["cluster"] = {"backend": "ray", "address": three_nodes.address, "cpus_per_worker": 1}
    one["checkpoint"] = {"every": 0}
    ascent("train", str(write_yaml(tmp_path / "one.yaml", one)), timeout=600)
    single = _final_weights(tmp_path / "one" / "run")
    for name, t in single.items():
        torch.testing.assert_close(multi[name], t, atol=1e-5, rtol=0, msg=name)
