"""`cluster.mps` at setup: when `mps_daemon` starts the run's own daemon (auto: the overlap layout only; on:
every Ray GPU run, an error if it cannot; off: never; a node's daemon or a joined cluster: none), and that the
daemon reaches the worker groups and is stopped at shutdown or when the build fails."""

from __future__ import annotations

import logging

import pytest

from ascent.cluster.errors import ClusterConfigError
from ascent.cluster.mps import MpsUnavailable
from ascent.config import RunConfig
from ascent.orchestrator import setup

OVERLAP = {"backend": "ray", "engine_sleeps": False, "gpus_per_worker": 1, "device": "cuda"}


def cfg(k: int = 1, **cluster) -> RunConfig:
    return RunConfig.model_validate({"cluster": cluster, "rollout": {"max_staleness": k}})


class FakeDaemon:
    def __init__(self, order: list[str] | None = None) -> None:
        self.order = [] if order is None else order

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/ascent-mps-x/pipe"}

    def stop(self) -> None:
        self.order.append("mps")


@pytest.fixture
def starts(monkeypatch) -> list[FakeDaemon]:
    """Daemons `mps_daemon` started (none on this node already, unless a test says so)."""
    started: list[FakeDaemon] = []

    def start() -> FakeDaemon:
        started.append(FakeDaemon())
        return started[-1]

    monkeypatch.setattr(setup, "start_mps", start)
    monkeypatch.setattr(setup, "node_daemon", lambda: None)
    return started


# ------------------------------------------------------------------------------------------------ decisions
def test_auto_starts_a_daemon_only_where_trainer_and_replicas_compute_at_once(starts):
    daemon = setup.mps_daemon(cfg(**OVERLAP))
    assert starts == [daemon]
    for run in [
        cfg(0, **OVERLAP),  # no staleness: the engine waits for the update
        cfg(**{**OVERLAP, "engine_sleeps": True}),
        cfg(**{**OVERLAP, "device": "cpu", "gpus_per_worker": 0}),
        cfg(**{**OVERLAP, "gpus_per_worker": 0}),
        cfg(**{**OVERLAP, "placement": "split", "engine_sleeps": True}),  # own GPUs each
        cfg(engine_sleeps=False),  # inline: one process
    ]:
        assert setup.mps_daemon(run) is None, run.cluster
    assert len(starts) == 1


def test_auto_runs_time_sliced_with_a_warning_where_mps_cannot_start(monkeypatch, caplog):
    def unavailable():
        raise MpsUnavailable("nvidia-cuda-mps-control is not on PATH")

    monkeypatch.setattr(setup, "start_mps", unavailable)
    monkeypatch.setattr(setup, "node_daemon", lambda: None)
    with caplog.at_level(logging.WARNING, logger="ascent"):
        assert setup.mps_daemon(cfg(**OVERLAP)) is None
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "cluster.mps=auto" in record.getMessage() and "not on PATH" in record.getMessage()
    assert "time slices" in record.getMessage()


def test_on_errors_out_naming_the_field_and_why(monkeypatch):
    def unavailable():
        raise MpsUnavailable("a CUDA client failed under MPS (exit 1): boom")

    monkeypatch.setattr(setup, "start_mps", unavailable)
    monkeypatch.setattr(setup, "node_daemon", lambda: None)
    with pytest.raises(ClusterConfigError, match=r"^cluster.mps=on: a CUDA client failed .*boom") as err:
        setup.mps_daemon(cfg(**OVERLAP, mps="on"))
    assert "cluster.mps=off" in str(err.value)


def test_on_starts_for_any_ray_gpu_run_and_off_never(starts):
    sleeping = {**OVERLAP, "engine_sleeps": True}
    assert setup.mps_daemon(cfg(0, **sleeping, mps="on")) is starts[0]  # no overlap: still asked for
    assert setup.mps_daemon(cfg(**OVERLAP, mps="off")) is None
    assert len(starts) == 1


def test_a_nodes_daemon_or_a_joined_cluster_starts_none(monkeypatch, starts):
    assert setup.mps_daemon(cfg(**OVERLAP, address="10.0.0.1:6379")) is None
    monkeypatch.setattr(setup, "node_daemon", lambda: "/tmp/nvidia-mps")
    assert setup.mps_daemon(cfg(**OVERLAP)) is None
    assert setup.mps_daemon(cfg(**OVERLAP, mps="on")) is None  # on: the node's serves
    assert starts == []


# ------------------------------------------------------------------------------------------------- wiring
class FakeGroup:
    def __init__(self, name: str, order: list[str]) -> None:
        self.name, self.order = name, order

    def shutdown(self) -> None:
        self.order.append(self.name)


def test_a_failed_build_stops_the_daemon_and_raises(monkeypatch):
    order: list[str] = []
    daemon = FakeDaemon(order)
    monkeypatch.setattr(setup, "mps_daemon", lambda c: daemon)
    seen = []

    def fail(c, plan, shared, mps):
        seen.append(mps)
        raise RuntimeError("no GPU for the trainer")

    monkeypatch.setattr(setup, "_build_groups", fail)
    with pytest.raises(RuntimeError, match="no GPU for the trainer"):
        setup.build_worker_groups(cfg())
    assert seen == [daemon] and order == ["mps"]


def test_the_groups_hold_the_daemon_and_stop_it_after_the_workers(monkeypatch):
    order: list[str] = []
    daemon = FakeDaemon(order)
    monkeypatch.setattr(setup, "mps_daemon", lambda c: daemon)

    def build(c, plan, shared, mps):
        assert mps is daemon
        return setup.WorkerGroups(
            rollout=FakeGroup("rollout", order),
            trainer=FakeGroup("trainer", order),
            critic=FakeGroup("critic", order),
        )

    monkeypatch.setattr(setup, "_build_groups", build)
    groups = setup.build_worker_groups(cfg())
    assert groups.mps is daemon and order == []
    groups.shutdown()
    assert order == ["rollout", "trainer", "critic", "mps"]


def test_without_a_daemon_the_groups_hold_none(monkeypatch):
    monkeypatch.setattr(setup, "mps_daemon", lambda c: None)
    order: list[str] = []
    monkeypatch.setattr(
        setup,
        "_build_groups",
        lambda c, plan, shared, mps: setup.WorkerGroups(
            FakeGroup("rollout", order), FakeGroup("t", order), None
        ),
    )
    groups = setup.build_worker_groups(cfg())
    assert groups.mps is None
    groups.shutdown()
    assert order == ["rollout", "t"]


def test_every_worker_group_gets_the_daemons_environment(monkeypatch):
    """rollout, trainer, critic and reward-model groups alike: a worker becomes the daemon's client only with
    its pipe directory set before it touches CUDA."""
    made: dict[str, dict] = {}

    def make_worker_group(cls, **kw):
        made[kw["name"]] = kw
        return FakeGroup(kw["name"], [])

    monkeypatch.setattr(setup, "make_worker_group", make_worker_group)
    monkeypatch.setattr(setup, "build_publisher", lambda c, groups: None)
    run = RunConfig.model_validate(
        {
            "model": {"path": "m"},
            "algorithm": {"advantage": "gae"},
            "reward": {"model": {"path": "rm"}},
        }
    )
    setup._build_groups(run, setup.placement_of(run), None, FakeDaemon())
    assert sorted(made) == ["critic", "reward_model", "rollout", "trainer"]
    assert all(kw["env"] == FakeDaemon().env() for kw in made.values())
    setup._build_groups(run, setup.placement_of(run), None, None)
    assert all("env" not in kw for kw in made.values())
