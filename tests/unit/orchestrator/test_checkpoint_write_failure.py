"""A checkpoint that cannot be written (a full disk) stops the run with one sentence: which checkpoint, why,
that the previous one is intact and resumable with --resume, and the fix; the previous one still loads."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors import SafetensorError

from ascent.cluster.errors import WorkerError
from ascent.orchestrator import checkpointing
from ascent.trainer.checkpoint import save_checkpoint

WEIGHTS = {"w": torch.arange(6.0).reshape(2, 3)}


def save_weights(directory: str) -> None:
    """What a trainer's save does, reduced to its safetensors write."""
    safetensors.torch.save_file(WEIGHTS, str(Path(directory) / "model.safetensors"))


def disk_full(tensors, filename, metadata=None):
    raise OSError(errno.ENOSPC, "No space left on device", filename)


def worker_disk_full(directory: str) -> None:
    """The same failure as it reaches the controller from a worker group (its error wrapped)."""
    cause = SafetensorError(
        'Error while serializing: IoError(Os { code: 28, message: "No space left on device" })'
    )
    raise WorkerError("trainer", 0, "save", f"{type(cause).__name__}: {cause}") from cause


@pytest.mark.parametrize("how", ["oserror", "worker"])
def test_a_full_disk_names_both_checkpoints_and_keeps_the_previous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    run = tmp_path / "run"
    state = {"note": "first", "config": {}, "sampler": {}}  # what a resume requires, and a note
    first = checkpointing.commit(run, 1, [save_weights], state, keep_last=3)
    writer = save_weights
    if how == "oserror":
        monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    else:
        writer = worker_disk_full
    with pytest.raises(checkpointing.CheckpointWriteError) as info:
        checkpointing.commit(run, 2, [writer], {}, keep_last=3)
    message = str(info.value)
    assert info.value.exit_code == 2 and "\n" not in message
    assert message.startswith(f"checkpoint {run / 'checkpoints' / 'iter_000002'} could not be written (")
    assert "No space left on device" in message
    assert f"the previous checkpoint {first} is intact and `--resume` continues from it" in message
    assert "Free space" in message and "run_dir" in message
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["iter_000001"]  # nothing half-written
    assert checkpointing.latest(run) == (first, {"iteration": 1, **state})
    assert torch.equal(safetensors.torch.load_file(str(first / "model.safetensors"))["w"], WEIGHTS["w"])


def test_a_bug_in_a_writer_is_not_called_a_full_disk(tmp_path: Path) -> None:
    def buggy(directory: str) -> None:
        raise KeyError("lm_head.weight")

    with pytest.raises(KeyError):
        checkpointing.commit(tmp_path / "run", 1, [buggy], {}, keep_last=1)


def test_the_trainer_checkpoint_says_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = save_checkpoint(tmp_path, 1, write_model=lambda d: save_weights(str(d)))
    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    with pytest.raises(checkpointing.CheckpointWriteError, match="No space left on device") as info:
        save_checkpoint(tmp_path, 2, write_model=lambda d: save_weights(str(d)))
    assert f"the previous checkpoint {first} is intact" in str(info.value)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["iter_000001"]
