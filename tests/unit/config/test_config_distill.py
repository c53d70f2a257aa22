"""`algorithm.teacher` and advantage=distill come together: each without the other is refused, naming the
field and the fix."""

import pytest

from ascent.config.schema import RunConfig


def test_distill_without_a_teacher_is_refused():
    with pytest.raises(ValueError, match="set algorithm.teacher to its checkpoint directory"):
        RunConfig(algorithm={"advantage": "distill"})


def test_a_teacher_without_distill_is_refused():
    with pytest.raises(ValueError, match=r"algorithm.teacher='/t': only advantage=distill reads it"):
        RunConfig(algorithm={"teacher": "/t"})


def test_distill_with_a_teacher_loads_with_its_settings():
    cfg = RunConfig(algorithm={"advantage": {"name": "distill", "reward_weight": 0.5}, "teacher": "/t"})
    a = cfg.algorithm
    assert a.teacher == "/t" and a.advantage.name == "distill"
    assert a.settings_for(a.advantage)["reward_weight"] == 0.5
