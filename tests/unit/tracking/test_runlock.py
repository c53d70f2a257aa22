"""The run-dir lock's one format: what `RunDirLock` writes is what the readers (`lock_is_held`, `lock_owner`,
the studio) read, and a second run is refused with the first one's pid and command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ascent.orchestrator.rundir import RunDirError, RunDirLock
from ascent.tracking.runlock import describe_owner, lock_is_held, lock_owner


def test_the_owner_the_run_writes_is_the_owner_readers_see(tmp_path: Path) -> None:
    assert lock_is_held(tmp_path) is None and lock_owner(tmp_path) == {}
    lock = RunDirLock(tmp_path).acquire()
    try:
        assert lock_is_held(tmp_path) is True
        owner = lock_owner(tmp_path)
        assert owner["pid"] == os.getpid() and {"host", "started", "command"} <= set(owner)
        with pytest.raises(RunDirError, match=f"in use by another ascent run \\(pid {os.getpid()} on "):
            RunDirLock(tmp_path).acquire()
    finally:
        lock.release()
    assert lock_is_held(tmp_path) is False
    assert describe_owner({}) == "owner unknown"
