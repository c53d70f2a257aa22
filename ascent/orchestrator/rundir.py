"""The run directory: checked before anything is written, and locked while a run writes it.

`open_run_dir` is the first thing `ascent train` and `ascent sft` do. It refuses a `run_dir` that is a file,
lies under a file or cannot be written, or whose `checkpoints` is a file or cannot be written (found before
any model loads, not at the first save), refuses to clobber an earlier run's checkpoints without `--resume`,
and takes an exclusive lock (`<run_dir>/.ascent.lock`, an `fcntl` lock the kernel drops when the process
dies, so a crashed run never leaves a stale lock). A second run into the same directory is refused with the
owner's pid and command instead of interleaving both runs' checkpoints and metrics.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import TextIO

from ascent.config import RunConfig, SFTConfig, write_resolved_config
from ascent.errors import AscentError
from ascent.tracking.runlock import LOCK_NAME, describe_owner, lock_owner, owner_record
from ascent.trainer.checkpoint_commit import CHECKPOINTS


class RunDirError(AscentError):
    """run_dir cannot be used: a file in the way, no permission, or another run holds it."""


class RunDirLock:
    """An exclusive, process-lifetime lock on a run directory; `release()` (or process exit) frees it."""

    def __init__(self, run_dir: Path, field: str = "run_dir"):
        self.path = run_dir / LOCK_NAME
        self.handle: TextIO | None = None
        self.field = field

    def acquire(self) -> RunDirLock:
        handle = open(self.path, "a+")  # noqa: SIM115 - held open for the life of the run
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            owner = describe_owner(lock_owner(self.path.parent))
            raise RunDirError(
                f"{self.field}={str(self.path.parent)!r} is in use by another ascent run ({owner}); two "
                "runs in one directory would overwrite each other's checkpoints and metrics. Wait for it to finish, "
                "stop it, or choose another run_dir."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(owner_record()))
        handle.flush()
        self.handle = handle
        return self

    def release(self) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


def check_writable_dir(path: Path, field: str = "run_dir") -> None:
    """Raise RunDirError naming `field` when `path` is a file, lies under a file, or cannot be
    created/written."""
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == path else f"lies under {str(parent)!r}, which is a file"
            raise RunDirError(f"{field}={str(path)!r} {where}; choose a directory path for {field}.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(
            f"{field}={str(path)!r} cannot be created ({err.strerror}); choose a directory you can write."
        ) from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise RunDirError(f"{field}={str(path)!r} is not writable; choose a directory you can write.")


def check_checkpoints_dir(run_dir: Path) -> None:
    """Raise RunDirError naming `<run_dir>/checkpoints` when a run could not save a checkpoint there: it is a
    file (or a broken link), or a directory that cannot be written. Nothing is created: a refused run
    leaves no empty `checkpoints/` behind."""
    path = run_dir / CHECKPOINTS
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunDirError(
                f"{str(path)!r} is not writable, so no checkpoint could be saved there; fix its permissions "
                "(chmod u+rwx) or choose another run_dir."
            )
    elif path.exists() or path.is_symlink():
        what = "a file" if path.exists() else "a broken link"
        raise RunDirError(
            f"{str(path)!r} is {what}, where the run saves its checkpoints (a directory); move or remove it, "
            "or choose another run_dir."
        )


def has_checkpoints(run_dir: Path) -> bool:
    ckpts = run_dir / CHECKPOINTS
    return ckpts.is_dir() and any(p.name.startswith("iter_") for p in ckpts.iterdir())


def open_run_dir(cfg: RunConfig | SFTConfig) -> tuple[Path, RunDirLock]:
    """Check, create and lock `cfg.run_dir`; returns the path and the held lock.

    Without `resume`, a run_dir that already holds checkpoints is refused (`ascent train` and `ascent sft`).
    The resolved config is written (`write_config`) only once the lock is held and, on resume, only after
    the checkpoint accepted the new settings, so a refused run changes nothing.
    """
    run_dir = Path(cfg.run_dir)
    check_writable_dir(run_dir)
    check_checkpoints_dir(run_dir)
    lock = RunDirLock(run_dir).acquire()
    if not cfg.resume and has_checkpoints(run_dir):
        lock.release()
        raise RunDirError(
            f"run_dir={cfg.run_dir!r} already holds checkpoints; pass --resume (resume=true) to continue "
            "that run, or choose a new run_dir."
        )
    return run_dir, lock


def write_config(cfg: RunConfig | SFTConfig) -> None:
    """`<run_dir>/config.yaml`: the resolved config of the run now writing the directory."""

    write_resolved_config(cfg, Path(cfg.run_dir))
