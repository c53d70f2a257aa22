"""The loop's env source steps `gym` batches in blocks inside the hosts when rollout.source.sims_per_worker
is set (`vector_envs`), gives simulator rows the run's frames folder (`with_frames`), and counts the
simulator actors' GPU shares (`rollout.env_gpus`) in what the run asks Ray for."""

from __future__ import annotations

from ascent.envs import Task
from ascent.envs.hosts import InlineHosts
from ascent.envs.sim import HostedSimEnvs
from ascent.orchestrator.episodes import vector_envs, with_frames

ROWS = [{"gym_id": "CartPole-v1", "seed": s, "env": "gym"} for s in (5, 6)]


def test_the_loop_steps_gym_batches_in_blocks_when_sims_per_worker_is_set():
    gym_tasks = [Task("gym", row, k) for k, row in enumerate(ROWS)]
    made = vector_envs(gym_tasks, InlineHosts(), 4)
    assert isinstance(made, HostedSimEnvs) and made.copies == 4
    assert vector_envs(gym_tasks, InlineHosts(), 0) is None  # off: one environment per episode
    assert vector_envs([*gym_tasks, Task("guess_number", {}, 9)], InlineHosts(), 4) is None


def test_only_simulator_rows_get_the_frames_folder():
    assert with_frames({"seed": 1}, "gym", "/r/frames") == {"seed": 1, "frames_dir": "/r/frames"}
    assert with_frames({"secret": 1}, "guess_number", "/r/frames") == {"secret": 1}


def test_simulator_actors_gpu_shares_count_in_what_the_run_asks_ray_for():
    from ascent.config import RunConfig
    from ascent.orchestrator.placement import demand

    def cfg(**rollout):
        source = {"name": "env", "env": "gym", "max_episode_tokens": 64}
        return RunConfig.model_validate(
            {
                "model": {"path": "m"},
                "data": {"train_path": "t.jsonl"},
                "cluster": {"backend": "ray"},
                "rollout": {"max_new_tokens": 4, "source": source, "env_workers": 4} | rollout,
            }
        )

    assert demand(cfg(env_gpus=0.25)).gpus == demand(cfg()).gpus + 1.0  # 4 actors x a quarter
    assert demand(cfg(env_gpus=0.25, env_isolation="inline")).gpus == demand(cfg()).gpus
