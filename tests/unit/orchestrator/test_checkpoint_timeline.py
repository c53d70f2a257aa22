"""Run checkpoints (`checkpointing.commit`) across a roll-back and a save killed between its two renames.

- A resume from a checkpoint older than the newest moves the newer ones aside (`abandoned_iter_X`), so
  pruning keeps the resumed run's own checkpoints and a later `--resume` never picks the abandoned ones.
- Pruning never deletes the checkpoint just written.
- Saving an iteration again, killed after the old copy was renamed aside: the next resume or commit puts
  the complete copy back as `iter_X` instead of picking an older one and deleting both copies.
- Pruning killed while it deletes an old checkpoint leaves no half-deleted `iter_X` for a resume to offer.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from ascent.config import RunConfig
from ascent.orchestrator import checkpointing as C


def _writer(tag: str):
    def write(directory: str) -> None:
        (Path(directory) / "weights.txt").write_text(tag)

    return write


def _commit(run: Path, iteration: int, keep_last: int, tag: str = "", **state) -> Path:
    state = {"config": {}, "sampler": {}} | state  # what a resume requires of state.json
    return C.commit(run, iteration, [_writer(tag or f"run-{iteration}")], state, keep_last)


def _names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def _cfg(run: Path) -> RunConfig:
    return RunConfig(model={"path": "m"}, data={"train_path": "d.jsonl"}, run_dir=str(run), resume=True)


def test_a_roll_back_moves_the_newer_checkpoints_aside_and_keep_last_1_keeps_the_new_one(tmp_path, caplog):
    run = tmp_path / "run"
    config = _cfg(run).model_dump(mode="json")
    for it in (4, 8):
        _commit(run, it, keep_last=5, config=config)
    with caplog.at_level(logging.WARNING, logger="ascent"):
        path, state = C.resume_state(_cfg(run), 10, "iterations=10", "iter_000004", accept=False)
    assert path.name == "iter_000004" and state["iteration"] == 4
    assert _names(run) == ["abandoned_iter_000008", "iter_000004"]  # nothing deleted
    assert "iter_000008" in caplog.text and "abandoned_iter_000008" in caplog.text
    written = _commit(run, 6, keep_last=1, tag="resumed-6")
    assert (written / "weights.txt").read_text() == "resumed-6"
    assert [p.name for p in C.checkpoint_dirs(run)] == ["iter_000006"]
    assert C.latest(run)[0] == written  # a later --resume continues the resumed run
    assert "abandoned_iter_000008" in _names(run)


def test_a_second_roll_back_to_the_same_iteration_keeps_both_abandoned_copies(tmp_path):
    run = tmp_path / "run"
    for round_ in range(2):
        _commit(run, 4, keep_last=5)
        _commit(run, 8, keep_last=5, tag=f"round-{round_}")
        C.abandon_newer(run, 4)
    assert _names(run) == ["abandoned_iter_000008", "abandoned_iter_000008.2", "iter_000004"]
    tags = {(run / "checkpoints" / n / "weights.txt").read_text() for n in _names(run)[:2]}
    assert tags == {"round-0", "round-1"}


def test_resuming_the_newest_moves_nothing(tmp_path):
    run = tmp_path / "run"
    for it in (2, 4):
        _commit(run, it, keep_last=5)
    assert C.abandon_newer(run, 4) == []
    assert _names(run) == ["iter_000002", "iter_000004"]


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path):
    run = tmp_path / "run"
    _commit(run, 8, keep_last=1)
    written = _commit(run, 6, keep_last=1)  # a newer one is present (no roll-back moved it)
    assert [p.name for p in C.checkpoint_dirs(run)] == ["iter_000006"]
    assert (written / "weights.txt").read_text() == "run-6"
    _commit(run, 9, keep_last=5)
    _commit(run, 7, keep_last=2)  # counts itself first, then the newest of the others
    assert [p.name for p in C.checkpoint_dirs(run)] == ["iter_000007", "iter_000009"]


def _killed_between_renames(monkeypatch, run: Path, iteration: int, tag: str) -> None:
    """Save `iteration` again and die right after the old copy was renamed to `.old_iter_X`."""
    real = os.replace

    def replace(src, dst):
        if Path(src).name.startswith(".tmp_"):
            raise KeyboardInterrupt("killed")
        real(src, dst)

    monkeypatch.setattr(C.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _commit(run, iteration, keep_last=1, tag=tag)
    monkeypatch.setattr(C.os, "replace", real)


@pytest.mark.parametrize("new_copy_whole", [True, False])
def test_a_save_killed_between_its_renames_is_repaired_on_resume(tmp_path, monkeypatch, new_copy_whole):
    run = tmp_path / "run"
    _commit(run, 3, keep_last=1, tag="first")
    _killed_between_renames(monkeypatch, run, 3, tag="second")
    assert _names(run) == [".old_iter_000003", ".tmp_iter_000003"]  # no iter_000003: what a death leaves
    if not new_copy_whole:
        (run / "checkpoints" / ".tmp_iter_000003" / "state.json").write_text('{"iterat')  # torn
    path, state = C.latest(run)
    assert path.name == "iter_000003" and state["iteration"] == 3
    assert (path / "weights.txt").read_text() == ("second" if new_copy_whole else "first")
    _commit(run, 4, keep_last=1)  # the next commit clears what is left, keeps iter_000004
    assert _names(run) == ["iter_000004"]


def test_a_commit_after_the_killed_save_repairs_before_it_prunes(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _commit(run, 3, keep_last=2, tag="first")
    _killed_between_renames(monkeypatch, run, 3, tag="second")
    _commit(run, 4, keep_last=2)  # no resume in between (the same process went on)
    assert [p.name for p in C.checkpoint_dirs(run)] == ["iter_000003", "iter_000004"]
    assert (run / "checkpoints" / "iter_000003" / "weights.txt").read_text() == "second"
    assert json.loads((run / "checkpoints" / "iter_000003" / "state.json").read_text())["iteration"] == 3


def test_pruning_killed_mid_deletion_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _commit(run, 1, keep_last=1)
    real = C.K.shutil.rmtree

    def killed(path, ignore_errors=False):  # deleting iter_000001: its weights go, then the process dies
        weights = Path(path) / "weights.txt"
        if not (weights.is_file() and weights.read_text() == "run-1"):
            return real(path, ignore_errors=ignore_errors)
        weights.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(C.K.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        _commit(run, 2, keep_last=1)
    monkeypatch.setattr(C.K.shutil, "rmtree", real)
    assert [p.name for p in C.checkpoint_dirs(run)] == ["iter_000002"]
    assert C.latest(run, "iter_000002")[0].name == "iter_000002"
    with pytest.raises(C.R.ResumeError, match="iter_000002"):
        C.latest(run, "iter_000001")  # not offered: it is gone, not half there
    _commit(run, 3, keep_last=1)  # the next pruning clears what the killed one left
    assert _names(run) == ["iter_000003"]
