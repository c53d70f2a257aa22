"""`reward.judge.model=policy@N` (`ascent.transport.pinned`): the judge's engine gets policy version N and
nothing after it, keeps a copy on disk, and a resumed run that starts past N loads that copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ascent.cluster.inline import InlineWorkerGroup
from ascent.errors import AscentError
from ascent.models import make_tiny_checkpoint
from ascent.orchestrator.workers import RolloutWorker
from ascent.rollout.specs import EngineSpec
from ascent.transport.pinned import JudgeEnd, PinnedPublisher, pinned_dir, read_pinned, write_pinned
from ascent.transport.publish import TrainerEnd

PIN = 1


class FakeTrainer:
    """A trainer whose weights at version v are the tiny model's plus v (tied embeddings stay tied)."""

    def __init__(self, base: dict[str, torch.Tensor]) -> None:
        self.base, self.version = base, 0

    def step(self, version: int) -> None:
        self.version = version

    def named_weights(self, to_cpu: bool = True) -> dict[str, torch.Tensor]:
        out = {k: v + self.version for k, v in self.base.items() if k != "lm_head.weight"}
        out["lm_head.weight"] = out["model.embed_tokens.weight"]  # one tensor under two names
        return out

    def unused(self, *args: object) -> None:
        raise AssertionError("a pinned publication uses no link")


class Recording:
    """The run's own publisher (to the rollout replicas): records the versions it published."""

    name, in_process = "inline", True

    def __init__(self) -> None:
        self.versions: list[int] = []

    def publish(self, version: int) -> None:
        self.versions.append(version)

    def describe(self) -> str:
        return "inline"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("pin") / "tiny", hidden_size=32, num_layers=1)


def judge_group(model: Path) -> InlineWorkerGroup[RolloutWorker]:
    spec = EngineSpec(name="reference", model_path=str(model), tokenizer_path=str(model), device="cpu")
    return InlineWorkerGroup(RolloutWorker, name="judge", init_kwargs={"spec": spec})


def held(group: InlineWorkerGroup[RolloutWorker]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in group.worker.engine.model.state_dict().items()}


def publisher(judge, trainer, run_dir: Path) -> tuple[PinnedPublisher, Recording]:
    t = FakeTrainer.unused
    end = TrainerEnd(trainer, named_weights=FakeTrainer.named_weights, address=t, join=t, send=t)
    pins = JudgeEnd(judge, pin=RolloutWorker.pin_weights, load=RolloutWorker.load_pinned)
    inner = Recording()
    return PinnedPublisher(inner, end, pins, PIN, pinned_dir(run_dir, PIN)), inner


def assert_weights(group, base: dict[str, torch.Tensor], plus: float) -> None:
    now = held(group)
    for k, v in base.items():
        torch.testing.assert_close(now[k], v + plus, rtol=0, atol=0, msg=k)


def test_the_judge_holds_version_n_after_later_publications_and_a_resume_loads_its_copy(model, tmp_path):
    judge = judge_group(model)
    base = held(judge)
    trainer = InlineWorkerGroup(FakeTrainer, name="trainer", init_args=(base,))
    pub, inner = publisher(judge, trainer, tmp_path)
    for version in range(4):
        trainer.call(FakeTrainer.step, version)
        pub.publish(version)
        assert_weights(judge, base, 0.0 if version < PIN else float(PIN))  # the initial weights until N
    assert inner.versions == [0, 1, 2, 3]  # the replicas get every publication
    kept = read_pinned(tmp_path / "judge" / "v1", PIN)
    assert set(kept) == set(base)
    assert all(torch.equal(kept[k], base[k] + PIN) for k in base)

    # a resumed run starting at version 3: a fresh judge (model.path) takes the copy, not the trainer's v3
    resumed, again = judge_group(model), InlineWorkerGroup(FakeTrainer, name="trainer", init_args=(base,))
    again.call(FakeTrainer.step, 3)
    pub2, _ = publisher(resumed, again, tmp_path)
    pub2.publish(3)
    assert_weights(resumed, base, float(PIN))
    assert "policy version 1 only" in pub2.describe()

    # without the copy a resume past N refuses, naming it
    pub3, _ = publisher(judge_group(model), again, tmp_path / "other")
    with pytest.raises(AscentError, match=r"other/judge/v1/model.safetensors, is missing"):
        pub3.publish(3)


def test_a_copy_of_another_version_is_refused(tmp_path):
    write_pinned({"w": torch.ones(2)}, tmp_path / "v2", 2)
    assert torch.equal(read_pinned(tmp_path / "v2", 2)["w"], torch.ones(2))
    with pytest.raises(AscentError, match="holds policy version 2, not 1"):
        read_pinned(tmp_path / "v2", 1)
