"""A distillation teacher must share the student's tokenizer: `preflight.check_teacher` refuses one whose
vocabulary differs (exit status 2, both paths and the fix named) and takes one that shares it; the trainer
spec carries the teacher's path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ascent.config import ConfigError
from ascent.config.schema import RunConfig
from ascent.models.loading import load_tokenizer
from ascent.models.tiny import make_tiny_checkpoint
from ascent.orchestrator import preflight
from ascent.orchestrator.specs import trainer_spec


def tiny(path, chars="0123456789+=", seed=0):
    return make_tiny_checkpoint(
        path, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=1, chars=chars, seed=seed
    )


def config(student, teacher):
    return SimpleNamespace(
        model=SimpleNamespace(path=str(student), tokenizer_path=None, trust_remote_code=False),
        algorithm=SimpleNamespace(advantage=SimpleNamespace(name="distill"), teacher=str(teacher)),
    )


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    student, teacher = tiny(tmp_path / "student"), tiny(tmp_path / "teacher", chars="abcdefgh")
    tok = load_tokenizer(student)
    with pytest.raises(ConfigError) as err:
        preflight.check_teacher(config(student, teacher), tok, len(tok))
    message = str(err.value)
    assert err.value.exit_code == 2
    assert "algorithm.teacher" in message and str(teacher) in message and str(student) in message
    assert "vocab_size" in message and "tokenizer" in message


def test_a_teacher_of_the_same_size_but_another_token_map_is_refused(tmp_path):
    student, teacher = tiny(tmp_path / "student"), tiny(tmp_path / "teacher", chars="=+9876543210")
    tok = load_tokenizer(student)
    with pytest.raises(ConfigError, match="maps tokens to other ids"):
        preflight.check_teacher(config(student, teacher), tok, len(tok))


def test_a_teacher_sharing_the_tokenizer_passes(tmp_path):
    student, teacher = tiny(tmp_path / "student"), tiny(tmp_path / "teacher", seed=1)
    tok = load_tokenizer(student)
    preflight.check_teacher(config(student, teacher), tok, len(tok))
    missing = config(student, tmp_path / "nowhere")
    with pytest.raises(Exception, match="algorithm.teacher"):
        preflight.check_teacher(missing, tok, len(tok))


def test_the_trainer_spec_carries_the_teacher_only_with_distill():
    cfg = RunConfig(algorithm={"advantage": "distill", "teacher": "/ckpt/teacher"})
    assert trainer_spec(cfg, 1).teacher_path == "/ckpt/teacher"
    assert trainer_spec(cfg, 1).need_reference is False  # the teacher is not a KL reference
    assert trainer_spec(RunConfig(), 1).teacher_path is None
