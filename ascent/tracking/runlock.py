"""The run-directory lock's file, `<run_dir>/.ascent.lock`: its name, what the owner writes in it, and the
probe a reader uses to tell a live run from a dead one.

A run takes an exclusive `fcntl` lock on the file for its whole life (`ascent.orchestrator.rundir.RunDirLock`)
and writes `owner_record()` into it; the kernel drops the lock when the process dies, so a crashed run never
leaves a stale one. Readers (`ascent studio`, `tracking.status`'s "running" that may be a killed run) call
`lock_is_held` and `lock_owner`. This sits in `tracking`, below both the orchestrator that takes the lock and
the studio that probes it, so the two share one copy of the format.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

LOCK_NAME = ".ascent.lock"


def owner_record() -> dict[str, Any]:
    """What the run taking the lock writes into it: pid, host, started (unix s) and command (argv joined)."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "command": " ".join(sys.argv),
    }


def lock_is_held(run_dir: Path) -> bool | None:
    """Whether a live process holds `<run_dir>/.ascent.lock` now (None: there is no lock file).

    It takes the lock without blocking and releases it at once, so a run that starts meanwhile is kept out
    for that instant only.
    """
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def lock_owner(run_dir: Path) -> dict[str, Any]:
    """What the run that took the lock wrote in it (`owner_record`'s keys); {} when absent or unreadable."""
    try:
        info = json.loads((run_dir / LOCK_NAME).read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


def describe_owner(info: dict[str, Any]) -> str:
    """`pid 12 on host since 2026-01-01 12:00:00: ascent train run.yaml`, or "owner unknown" for {}."""
    if not info:
        return "owner unknown"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {since}: {info.get('command', '?')}"
