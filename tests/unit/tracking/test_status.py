"""status.json through the bus: running at the start with who runs it, a heartbeat per step, and the end
state: finished, crashed with the error's one line, interrupted by a stop at a safe point or Ctrl-C."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from ascent.orchestrator.interrupt import STOPS, stopped_message
from ascent.tracking import EventBus, Metrics, RunStarted, StatusSink, read_status, tracked_run

KEYS = {
    "schema",
    "state",
    "kind",
    "pid",
    "host",
    "command",
    "started_at",
    "updated_at",
    "step",
    "total_steps",
    "error",
}


def run(tmp_path, body, kind="train", resume_step=0):
    started = RunStarted(str(tmp_path), kind, {}, total_steps=5, resume_step=resume_step)
    with tracked_run(EventBus([StatusSink(tmp_path)]), started, STOPS) as bus:
        body(bus)


def test_running_then_heartbeat_then_finished(tmp_path):
    seen = []

    def body(bus):
        seen.append(read_status(tmp_path))
        bus.publish(Metrics.of(1, {"x": 1}))
        seen.append(read_status(tmp_path))

    run(tmp_path, body, kind="sft")
    first, beat = seen
    assert set(first) == KEYS and first["schema"] == 1
    assert first["state"] == "running" and first["kind"] == "sft" and first["step"] is None
    assert first["pid"] == os.getpid() and first["host"] == socket.gethostname()
    assert first["command"] == sys.argv and first["total_steps"] == 5 and first["error"] is None
    assert beat["step"] == 1 and beat["updated_at"] >= first["updated_at"] and beat["state"] == "running"
    end = read_status(tmp_path)
    assert end["state"] == "finished" and end["step"] == 1 and end["started_at"] == first["started_at"]
    assert not list(tmp_path.glob("*.tmp"))  # written through a temp file that was renamed


def test_crashed_with_the_error(tmp_path):
    def body(bus):
        bus.publish(Metrics.of(2, {"x": 1}))
        raise RuntimeError("CUDA out of memory\nTried to allocate 2 GiB")

    with pytest.raises(RuntimeError):
        run(tmp_path, body, resume_step=1)
    status = read_status(tmp_path)
    assert status["state"] == "crashed" and status["step"] == 2
    assert status["error"] == "RuntimeError: CUDA out of memory"


@pytest.mark.parametrize("stop", ["safe_point", "ctrl_c"])
def test_interrupted(tmp_path, stop):
    def body(bus):
        if stop == "safe_point":
            raise stopped_message(15, "iteration", None, 1, 5)
        raise KeyboardInterrupt

    with pytest.raises(STOPS):
        run(tmp_path, body, resume_step=3)
    status = read_status(tmp_path)
    assert status["state"] == "interrupted" and status["error"] is None and status["step"] == 3


def test_read_status_without_a_file(tmp_path):
    assert read_status(tmp_path) is None
    (tmp_path / "status.json").write_text("{trunc")
    assert read_status(tmp_path) is None
