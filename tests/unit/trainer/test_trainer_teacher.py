"""PolicyWorker's distillation teacher (`teacher_path`): a frozen checkpoint scored by
`compute_logprobs(which="teacher")` like the reference, untouched by updates; refused when absent."""

from __future__ import annotations

from dataclasses import replace

import pytest
from trainer_helpers import make_samples

from ascent.models.tiny import make_tiny_checkpoint
from ascent.trainer import OptimSettings, PolicyWorker, minibatch_totals
from ascent.trainer.settings import TrainerSpec


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def test_the_teacher_scores_like_its_own_checkpoint_and_stays_frozen(tiny_path, tmp_path):
    teacher_path = make_tiny_checkpoint(
        tmp_path / "teacher", seed=1
    )  # the student's tokenizer, other weights
    spec = TrainerSpec(
        model_path=str(tiny_path), device="cpu", optim=OptimSettings(lr=1e-2), teacher_path=str(teacher_path)
    )
    worker = PolicyWorker.from_spec(spec)
    assert worker.teacher is not None and not any(p.requires_grad for p in worker.teacher.parameters())
    samples = make_samples(4)
    teacher = worker.compute_logprobs(samples, 1.0, which="teacher")
    alone = PolicyWorker(teacher_path, device="cpu").compute_logprobs(samples, 1.0)
    assert flat(teacher) == pytest.approx(flat(alone), abs=1e-5)
    policy = worker.compute_logprobs(samples, 1.0)
    assert flat(teacher) != pytest.approx(flat(policy), abs=1e-3)  # another model
    samples = [
        replace(s, old_logprobs=lp, advantages=[1.0] * len(lp)) for s, lp in zip(samples, policy, strict=True)
    ]
    tokens, seqs = minibatch_totals(samples)
    worker.update(samples, total_tokens=tokens, total_seqs=seqs)
    assert flat(worker.compute_logprobs(samples, 1.0)) != pytest.approx(flat(policy), abs=1e-6)  # it moved
    assert worker.compute_logprobs(samples, 1.0, which="teacher") == teacher  # the teacher did not


def test_no_teacher_unless_asked(tiny_path):
    worker = PolicyWorker(tiny_path, device="cpu")
    assert worker.teacher is None
    with pytest.raises(ValueError, match="no teacher"):
        worker.compute_logprobs(make_samples(1), which="teacher")
    with pytest.raises(ValueError, match="'policy', 'reference' or 'teacher'"):
        worker.compute_logprobs(make_samples(1), which="critic")
