"""Config fields reach the parts that use them: the builders' flat arguments carry each one."""

from __future__ import annotations

from ascent.cluster.hosts import IsolationPolicy
from ascent.config import RunConfig
from ascent.envs.hosts import InlineHosts
from ascent.orchestrator import placement, setup, specs
from ascent.orchestrator.batch import sampling_params


def cfg(**sections) -> RunConfig:
    return RunConfig(**({"model": {"path": "m"}, "data": {"train_path": "d.jsonl"}} | sections))


def test_dr_grpo_divisor_defaults_to_max_new_tokens_for_every_worker():
    c = cfg(rollout={"max_new_tokens": 96}, algorithm={"loss_aggregation": "seq-mean-token-sum-norm"})
    assert specs.trainer_spec(c, total_optimizer_steps=10).loss.max_len == 96
    c2 = cfg(rollout={"max_new_tokens": 96}, algorithm={"max_response_tokens_norm": 50})
    assert specs.trainer_spec(c2, total_optimizer_steps=10).loss.max_len == 50


def test_engine_gets_trust_remote_code_and_sampling_gets_repetition_penalty():
    c = cfg(
        model={"path": "m", "trust_remote_code": True}, rollout={"repetition_penalty": 1.2, "engine": "fast"}
    )
    assert specs.engine_spec(c).builder_kwargs()["trust_remote_code"] is True
    assert sampling_params(c.rollout).repetition_penalty == 1.2
    assert sampling_params(c.rollout, validation=True).repetition_penalty == 1.0


def test_reward_isolation_settings_build_the_pool():
    runner = setup.build_reward_runner(
        cfg(reward={"timeout_s": 2.5, "num_workers": 3, "memory_limit_mb": 1000})
    )
    assert runner.executor.policy == IsolationPolicy(
        "reward", 2.5, "reward.timeout_s", memory_mb=1000, memory_field="reward.memory_limit_mb"
    )
    assert runner.executor.num_hosts == 3
    assert isinstance(setup.build_reward_runner(cfg(reward={"isolation": "inline"})).executor, InlineHosts)


def test_env_isolation_settings_build_the_hosts():
    """inline: the environments run in this process (`breakpoint()` works); process: hosts under the
    environment policy, read from rollout.env_timeout_s, rollout.env_memory_limit_mb and rollout.env_workers."""
    from ascent.orchestrator.episodes import env_hosts

    with env_hosts(
        cfg(rollout={"source": {"name": "env", "env": "guess_number"}, "env_isolation": "inline"}).rollout
    ) as hosts:
        assert isinstance(hosts, InlineHosts)
    with env_hosts(
        cfg(
            rollout={
                "source": {"name": "env", "env": "guess_number"},
                "env_timeout_s": 7,
                "env_workers": 2,
                "env_memory_limit_mb": 0,
            }
        ).rollout
    ) as hosts:
        field = "rollout.env_memory_limit_mb"
        assert hosts.policy == IsolationPolicy(
            "environment", 7, "rollout.env_timeout_s", memory_mb=0, memory_field=field
        )
        assert hosts.num_hosts == 2


def test_placement_plans_split_colocated_and_inline():
    """split: own GPUs per worker; colocated on Ray: bundle i shared by trainer rank i and replica i (and
    critic rank i), equal fractions; inline or CPU: nothing to place."""
    split = placement.plan_placement("ray", "split", 1.0, 2.0, num_trainers=2, groups=1)
    assert (split.trainer_gpus, split.rollout_gpus, split.shared_bundles) == (1.0, 1.0, 0)
    col = placement.plan_placement("ray", "colocated", 1.0, 2.0, num_trainers=4, groups=1)
    assert (col.trainer_gpus, col.rollout_gpus) == (0.5, 0.5)
    assert (col.shared_bundles, col.bundle_gpus, col.bundle_cpus) == (4, 1.0, 4.0)
    critic = placement.plan_placement("ray", "colocated", 1.0, 1.0, num_trainers=2, groups=2)
    assert critic.trainer_gpus == critic.rollout_gpus == 1 / 3 and critic.bundle_cpus == 3.0
    for backend, gpus in (("inline", 1.0), ("ray", 0.0)):
        plan = placement.plan_placement(backend, "colocated", gpus, 1.0, num_trainers=1, groups=1)
        assert (plan.rollout_gpus, plan.shared_bundles) == (0.0, 0)


def test_split_placement_gives_each_component_its_own_gpu_count():
    """trainer_gpus / rollout_gpus / reward_model_gpus, by default gpus_per_worker (rollout: times
    rollout.tensor_parallel), which the engine's builder receives."""
    split = {"backend": "ray", "placement": "split", "gpus_per_worker": 1}
    own = cfg(
        cluster={**split, "trainer_gpus": 2, "reward_model_gpus": 0.5}, reward={"model": {"path": "rm"}}
    )
    plan = placement.placement_of(own)
    assert (plan.trainer_gpus, plan.rollout_gpus, plan.reward_gpus) == (2.0, 1.0, 0.5)
    assert placement.demand(own).gpus == 2 + 1 + 0.5
    tp = cfg(cluster=split, rollout={"engine": "fast", "tensor_parallel": 4})
    assert placement.placement_of(tp).rollout_gpus == 4.0
    assert specs.engine_spec(tp).builder_kwargs()["tensor_parallel"] == 4  # the replica starts its ranks
    assert setup.weight_transport_kind(tp) == "broadcast"  # GPUs of their own: NCCL
    halves = cfg(cluster={**split, "trainer_gpus": 0.5})  # a trainer rank shares a GPU: no NCCL to it
    assert setup.weight_transport_kind(halves) == "cuda_ipc"


def test_publications_land_mid_generation_only_where_replicas_generate_alongside():
    """swap_mid_generation needs the fast engine on replicas that sample while the trainer computes: Ray
    split, or Ray colocated with the engine awake; not inline, not colocated with the engine asleep."""
    from ascent.config import load_config

    def swaps(*overrides: str) -> bool:
        return setup.swaps_mid_generation(load_config(None, ["rollout.engine=fast", *overrides]))

    assert swaps("cluster.backend=ray", "cluster.placement=split")
    assert swaps("cluster.backend=ray", "cluster.engine_sleeps=false")
    assert not swaps("cluster.backend=ray")
    assert not swaps("cluster.engine_sleeps=false")  # inline: one process, generation and update take turns
    assert not swaps("cluster.backend=ray", "cluster.placement=split", "rollout.swap_mid_generation=off")


def test_colocated_replicas_must_pair_with_trainer_ranks():
    import pytest

    from ascent.config import ConfigError, load_config

    base = ["cluster.backend=ray", "cluster.gpus_per_worker=1", "cluster.num_trainer_workers=2"]
    with pytest.raises(ConfigError, match=r"cluster.num_rollout_workers=1: with cluster.placement=colocated"):
        load_config(None, [*base, "train.trajectories_per_update=8", "rollout.prompts_per_step=4"])
    load_config(
        None,
        [
            *base,
            "cluster.num_rollout_workers=2",
            "train.trajectories_per_update=8",
            "rollout.prompts_per_step=4",
        ],
    )
    load_config(
        None,
        [*base, "cluster.placement=split", "train.trajectories_per_update=8", "rollout.prompts_per_step=4"],
    )
