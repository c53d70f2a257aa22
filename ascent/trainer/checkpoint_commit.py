"""Atomic checkpoint directories: stage, commit, recover, prune (design: "trainer/ ... checkpoint").

The one implementation of the commit both kinds of checkpoint use: the trainer's (`ascent.trainer.checkpoint`)
and the run's (`ascent.orchestrator.checkpointing`, which adds the controller's state and roll-backs).
A checkpoint `<run_dir>/checkpoints/iter_000005/` is written into a staging copy beside it (`stage`,
`write_staged`: files fsynced, deleted again on any failure) and renamed into place (`commit`). Saving an
iteration again renames the old copy aside first and deletes it only once the new one is in place; a death
between the two renames is repaired by `recover`: the complete new copy, else the old one, becomes `iter_X`
again. A checkpoint is complete when its `state.json`, written last, parses (`complete`). Pruning renames a
checkpoint aside (`.del<sep>iter_X`) before deleting it, so a death mid-deletion leaves no half of it behind.

How the copies in flight are named is the caller's `Staging`; with `pid`, the name carries the writing
process's id and copies of a process still running (its save in progress) are never repaired.

A save that fails for the machine's reasons (a full disk, a quota, permissions: an OSError, or the
safetensors / torch writer's error for one, also when a worker's error carries it) raises
`CheckpointWriteError`: one sentence naming the checkpoint, why, the previous checkpoint that is intact and
resumable with `--resume`, and the fix. Any other failure (a bug) goes on as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ascent.errors import AscentError

log = logging.getLogger("ascent")

CHECKPOINTS = "checkpoints"
STATE_JSON = "state.json"
_NAME = re.compile(r"^iter_(\d+)$")


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


@dataclasses.dataclass(frozen=True)
class Staging:
    """How a checkpoint's copies in flight are named beside it: `.tmp<sep>iter_X` (the new copy being
    written) and `.old<sep>iter_X` (the copy it replaces, until the new one is in place), each followed by
    `-<pid>` of the writing process when `pid`."""

    sep: str
    pid: bool

    def tmp(self, final: Path) -> Path:
        return final.parent / self._name("tmp", final.name)

    def old(self, final: Path) -> Path:
        return final.parent / self._name("old", final.name)

    def _name(self, kind: str, name: str) -> str:
        return f".{kind}{self.sep}{name}" + (f"-{os.getpid()}" if self.pid else "")

    def parse(self, name: str) -> tuple[str, int | None] | None:
        """A copy's directory name -> (the checkpoint's name, the writer's pid or None); None for others."""
        writer = r"-(\d+)" if self.pid else ""
        m = re.match(rf"^\.(?:tmp|old){re.escape(self.sep)}(iter_\d+){writer}$", name)
        if m is None:
            return None
        return m.group(1), (int(m.group(2)) if self.pid else None)

    def doomed(self, final: Path) -> Path:
        """Where pruning moves `final` before deleting it (`.del<sep>iter_X`): never repaired by `recover`."""
        return final.parent / self._name("del", final.name)

    def stale(self, root: Path) -> list[Path]:
        """Every copy in flight under `root` (pruning deletes them: a save or a pruning killed mid-way left
        them)."""
        starts = (f".tmp{self.sep}", f".old{self.sep}", f".del{self.sep}")
        return [p for p in root.iterdir() if p.is_dir() and p.name.startswith(starts)]


def numbered(root: Path) -> list[Path]:
    """The `iter_X` directories under `root`, oldest first (copies in flight and other names ignored)."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def complete(path: Path) -> bool:
    """Whether `path` holds a whole checkpoint: its state.json, written last, is there and parses."""
    try:
        return isinstance(json.loads((path / STATE_JSON).read_text()), dict)
    except (OSError, ValueError):
        return False


def stage(tmp: Path) -> Path:
    """Create `tmp` empty (and its parents), removing what a killed save left there; return it."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def write_staged(tmp: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)`, then fsync every file under `tmp`; on any failure (an interrupt too) delete `tmp`, so
    nothing half-written is left behind, and re-raise."""
    try:
        write(tmp)
        _fsync_files(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class CheckpointWriteError(AscentError):
    """A checkpoint could not be written (disk full, quota, permissions); the previous ones are intact."""


# how a write failure shows when it crossed a process boundary as text (a Ray worker's error), or came from a
# writer that reports I/O errors in its own type (safetensors' SafetensorError, torch's stream writer)
_IO_MARKS = (
    "OSError",
    "No space left",
    "Disk quota",
    "Permission denied",
    "Read-only file system",
    "IoError",
    "SafetensorError",
    "PytorchStreamWriter",
    "file write failed",
)


def write_failure(err: BaseException) -> str | None:
    """Why a checkpoint write failed, when the machine is to blame (see the module doc); None for a bug."""
    seen: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    for e in seen:  # the root cause first when it is an OSError: it names the file
        if isinstance(e, OSError):
            return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    for e in reversed(seen):
        text = f"{type(e).__name__}: {e}"
        if any(mark in text for mark in _IO_MARKS):
            return " ".join(text.split())[:400]
    return None


def write_error(final: Path, previous: Path | None, why: str) -> CheckpointWriteError:
    """The one-sentence error for checkpoint `final` that failed to write (`previous`: the newest intact)."""
    intact = (
        f"the previous checkpoint {previous} is intact and `--resume` continues from it"
        if previous is not None
        else "there is no earlier checkpoint to resume from"
    )
    return CheckpointWriteError(
        f"checkpoint {final} could not be written ({why}); nothing half-written was left behind and "
        f"{intact}. Free space (or fix permissions) under {final.parent}, or point run_dir at a disk with "
        "room, then run the same command with --resume."
    )


class CheckpointReadError(AscentError):
    """A checkpoint's file is missing or does not load (damaged on disk); the message offers the newest
    complete checkpoint before it."""


def read_error(file: Path, problem: str) -> CheckpointReadError:
    """The one-sentence error for a checkpoint's `file` that is `problem` ("missing", "not loadable ..."),
    worded as `ascent.orchestrator.resume.verify_checkpoint`'s: the checkpoint is the `iter_X` directory
    holding `file` (a critic's `iter_X/critic/` too), and the newest complete one before it is offered."""
    ckpt = next((p for p in file.parents if _NAME.match(p.name)), file.parent)
    earlier = [p for p in numbered(ckpt.parent) if p.name < ckpt.name and complete(p)]
    return CheckpointReadError(damaged_text(ckpt, file.relative_to(ckpt).as_posix(), problem, earlier))


def damaged_text(ckpt: Path, name: str, problem: str, earlier: list[Path]) -> str:
    """Checkpoint `ckpt` is damaged: its file `name` is `problem`; the newest of `earlier` (complete
    checkpoints before it, oldest first) is offered, or a new run_dir when there is none."""
    offer = (
        f" The previous complete checkpoint is {earlier[-1].name}: resume from it with --resume-from "
        f"{earlier[-1].name}."
        if earlier
        else " There is no earlier checkpoint; start over in a new run_dir."
    )
    return f"checkpoint {str(ckpt)!r} is damaged: {name} is {problem}.{offer}"


def commit(tmp: Path, final: Path, old: Path) -> Path:
    """Rename the written staging copy `tmp` to `final`. An existing `final` (the same iteration saved again)
    is renamed to `old` first and deleted only once the new copy is in place. -> `final`."""
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_parent(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def recover(root: Path, staging: Staging) -> list[Path]:
    """Repair saves killed between the two renames of `commit`: where `iter_X` is missing, its complete new
    copy or else its complete old copy becomes `iter_X`; copies of a running writer are left alone. ->
    repaired."""
    if not root.is_dir():
        return []
    repaired = []
    for name, copies in sorted(_copies(root, staging).items()):
        final = root / name
        copy = next((c for c in copies if complete(c)), None)
        if copy is None or final.exists():
            continue
        os.replace(copy, final)
        fsync_parent(final)
        log.warning("restored checkpoint %s from %s (a save was killed between its renames)", final, copy)
        repaired.append(final)
    return repaired


def _copies(root: Path, staging: Staging) -> dict[str, list[Path]]:
    """Each checkpoint name's copies in flight that no running process is writing, new copies first."""
    found: dict[str, list[Path]] = {}
    for path in sorted(root.iterdir(), key=lambda p: (not p.name.startswith(".tmp"), p.name)):
        parsed = staging.parse(path.name)
        if parsed is None or not path.is_dir():
            continue
        name, writer = parsed
        if writer is None or not _running(writer):
            found.setdefault(name, []).append(path)
    return found


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # running, as another user
        return True
    return True


def prune(root: Path, staging: Staging, found: list[Path], keep_last: int, keep: Path | None) -> list[Path]:
    """Delete all but the newest `keep_last` of the checkpoints `found` (oldest first; `keep`, the one just
    written, counts first and is never deleted) and every copy in flight under `root`. -> what was deleted.
    A checkpoint is renamed aside before it is deleted, so a death mid-deletion never leaves a half-deleted
    one under its `iter_X` name (where a resume, or a damaged newer one's error, would offer it)."""
    others = [p for p in found if p != keep]
    doomed = others[: max(len(others) - keep_last + (keep is not None), 0)]
    for path in doomed:
        with contextlib.suppress(FileNotFoundError):  # deleted meanwhile: nothing to do
            os.replace(path, staging.doomed(path))
    for path in staging.stale(root):
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def fsync_parent(path: Path) -> None:
    """Make a rename of `path` durable: fsync the directory that holds it (POSIX; a no-op elsewhere)."""
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_files(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
