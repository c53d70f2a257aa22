"""Run checkpoints: the trainer's weights and optimizer plus the controller's state, written atomically.

Layout: `<run_dir>/checkpoints/iter_000005/` holds the HF weights (loadable by `from_pretrained`), the
trainer state (sharded runs: torch.distributed.checkpoint shards of weights and optimizer, written by every
rank at once), and `state.json` (iteration, data position, config). Everything is written into a temporary
sibling directory `.tmp_iter_000005` and renamed at the end, so a crash, even one that kills a rank in the
middle of a DCP write, never leaves a half-written checkpoint under a name a resume would pick; the next
commit removes what it left. Saving an iteration again (`iter_X` exists) renames the old copy to
`.old_iter_X`, the new one into place, and only then deletes the old copy; a death between the two renames is
repaired by `recover` (run by every resume and commit): the complete new copy, else the old one, becomes
`iter_X` again. These mechanics are `ascent.trainer.checkpoint_commit`'s, shared with the trainer's own
checkpoints.

One run directory holds one timeline. A resume from a checkpoint older than the newest (`--resume-from`, a
roll-back) moves the newer ones aside to `abandoned_iter_X` (`abandon_newer`; nothing is deleted), so pruning
and a later `--resume` never mix them with the resumed run's checkpoints.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ascent.config import RunConfig, SFTConfig
from ascent.orchestrator import resume as R
from ascent.orchestrator.collector import trim_after
from ascent.orchestrator.workers import CriticWorkerActor, TrainerWorker
from ascent.trainer import checkpoint_commit as K
from ascent.trainer.checkpoint_commit import CheckpointWriteError as CheckpointWriteError  # re-exported

if TYPE_CHECKING:
    from ascent.orchestrator.run import LoopState, Run

log = logging.getLogger("ascent")

PREFIX = "iter_"
ABANDONED = "abandoned_"  # + a checkpoint's name: moved aside by a roll-back
STAGING = K.Staging(sep="_", pid=False)  # `.tmp_iter_X`, `.old_iter_X`: see ascent.trainer.checkpoint_commit


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary directories are ignored)."""
    return [p for p in K.numbered(Path(run_dir) / K.CHECKPOINTS) if (p / K.STATE_JSON).exists()]


def commit(
    run_dir: str | Path,
    iteration: int,
    writers: list[Callable[[str], None]],
    state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write one checkpoint atomically: every writer fills a temp dir, then `state.json`, then a rename.

    A crash at any point leaves either the previous complete checkpoints or the new one, never half of it.
    Older checkpoints beyond `keep_last` are pruned afterwards.
    """
    root = Path(run_dir) / K.CHECKPOINTS
    final = root / K.checkpoint_name(iteration)
    tmp = STAGING.tmp(final)
    recover(run_dir)  # a save killed between its two renames: put its complete copy back first

    def fill(directory: Path) -> None:
        for write in writers:
            write(str(directory))
        (directory / K.STATE_JSON).write_text(json.dumps({"iteration": iteration, **state}, indent=1))

    try:
        K.write_staged(K.stage(tmp), fill)  # never leaves a half-written .tmp_* behind
        K.commit(tmp, final, STAGING.old(final))
    except Exception as err:
        why = K.write_failure(err)
        if why is None:  # not the machine's: a bug, with its traceback
            raise
        previous = [p for p in checkpoint_dirs(run_dir) if p != final]
        raise K.write_error(final, previous[-1] if previous else None, why) from err
    K.prune(root, STAGING, checkpoint_dirs(run_dir), keep_last, keep=final)
    log.info("checkpoint written: %s", final)
    return final


def write_whole(directory: str | Path, writers: list[Callable[[str], None]]) -> Path:
    """Write `directory` (an SFT run's `final/`) as a checkpoint is written: every writer fills a staging copy
    beside it, which is renamed into place, replacing an older `directory` only once it is whole. A run
    killed meanwhile leaves the older one (or none), never a mix of old and half-written files."""
    final = Path(directory)
    tmp = STAGING.tmp(final)

    def fill(staged: Path) -> None:
        for write in writers:
            write(str(staged))

    K.write_staged(K.stage(tmp), fill)
    return K.commit(tmp, final, STAGING.old(final))


def recover(run_dir: str | Path) -> list[Path]:
    """Repair saves killed between their two renames: where `iter_X` is missing, its complete staging copy
    `.tmp_iter_X` (state.json readable) or else the old copy `.old_iter_X` becomes `iter_X`. -> repaired."""
    return K.recover(Path(run_dir) / K.CHECKPOINTS, STAGING)


def abandon_newer(run_dir: str | Path, iteration: int) -> list[Path]:
    """Move the checkpoints of `run_dir` newer than `iteration` (the one a resume continues from) aside to
    `abandoned_iter_X`, which no resume or pruning picks, and warn; nothing is deleted. -> their new paths."""
    moved = []
    for path in checkpoint_dirs(run_dir):
        if int(path.name[len(PREFIX) :]) <= iteration:
            continue
        target = path.parent / f"{ABANDONED}{path.name}"
        n = 1
        while target.exists():  # an earlier roll-back abandoned the same iteration: keep both
            n += 1
            target = path.parent / f"{ABANDONED}{path.name}.{n}"
        os.replace(path, target)
        K.fsync_parent(target)
        moved.append(target)
    if moved:
        log.warning(
            "resuming from iteration %d of %s: the newer checkpoints %s belong to the abandoned continuation "
            "and were moved aside to %s (nothing deleted: rename one back to iter_... to go back to it)",
            iteration,
            run_dir,
            ", ".join(p.name.removeprefix(ABANDONED) for p in moved),
            ", ".join(p.name for p in moved),
        )
    return moved


def latest(run_dir: str | Path, resume_from: str | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume (the newest, or `resume_from`), verified, and its state.json; or None."""
    recover(run_dir)
    path = R.pick_checkpoint(checkpoint_dirs(run_dir), resume_from)
    if path is None:
        log.warning("resume=true but %s has no checkpoint yet: starting from the beginning", run_dir)
        return None
    return path, json.loads((path / "state.json").read_text())


def resume_state(
    cfg: RunConfig | SFTConfig, total: int, what: str, resume_from: str | None, accept: bool
) -> tuple[Path, dict[str, Any]] | None:
    """Find, verify and vet the checkpoint to resume: the same run (or `accept`), not past `total` (`what`).
    Checkpoints newer than it (a roll-back) are then moved aside (`abandon_newer`)."""
    found = latest(cfg.run_dir, resume_from)
    if found is None:
        return None
    path, state = found
    R.check_kind(state, "SFT" if isinstance(cfg, SFTConfig) else "RL", path)
    R.check_same_run(state, cfg.model_dump(mode="json"), accept, path, type(cfg)().model_dump(mode="json"))
    R.check_iterations(int(state["iteration"]), total, what, path)
    abandon_newer(cfg.run_dir, int(state["iteration"]))  # a roll-back: the newer ones are another timeline
    return path, state


@dataclass(frozen=True)
class CheckpointSpec:
    """What the loop's checkpoints read of the config, taken once at setup (`of`): when to save
    (`checkpoint.every`, and on a signal `checkpoint.on_interrupt`), what (`save_optimizer`, `hf_weights`),
    how many to keep, and the resolved config a checkpoint saves for `--resume` to compare."""

    run_dir: str
    iterations: int
    every: int
    keep_last: int
    save_optimizer: bool
    hf_weights: str
    on_interrupt: bool
    config: dict[str, Any]

    @classmethod
    def of(cls, cfg: RunConfig) -> CheckpointSpec:
        c = cfg.checkpoint
        config = cfg.model_dump(mode="json")
        return cls(
            cfg.run_dir,
            cfg.iterations,
            c.every,
            c.keep_last,
            c.save_optimizer,
            c.hf_weights,
            c.on_interrupt,
            config,
        )


def save(run: Run, state: LoopState, iteration: int) -> Path:
    """Checkpoint `iteration` of an RL run: trainer (and critic) weights and optimizer, data position, KL."""
    spec = run.spec.checkpoint
    optimizer = spec.save_optimizer
    hf = spec.hf_weights == "every" or iteration == spec.iterations
    writers = [
        lambda d: run.trainer.call(TrainerWorker.save, d, optimizer, hf),
        run.data.tokenizer.save_pretrained,
    ]
    critic = run.critic
    if critic is not None:
        writers.append(lambda d: critic.call(CriticWorkerActor.save, d, optimizer, hf))
    saved = {
        "sampler": run.collector.sampler_state(state.sampler, iteration),  # before draws prefetched for later
        **state.state_dict(),
        "config": spec.config,
        "fingerprints": R.fingerprints(spec.config),
    }
    return commit(spec.run_dir, iteration, writers, saved, spec.keep_last)


def restore(run: Run, state: LoopState, found: tuple[Path, dict[str, Any]]) -> int:
    """Load the checkpoint `resume_state` found into the workers and the loop `state`; return its
    iteration."""
    path, saved = found
    run.trainer.call(TrainerWorker.load, str(path))
    if run.critic is not None:
        run.critic.call(CriticWorkerActor.load, str(path))
    state.load_state_dict(saved)
    trim_after(run.spec.run_dir, int(saved["iteration"]))
    log.info("resumed from %s (iteration %d)", path, saved["iteration"])
    return int(saved["iteration"])
