"""Stateless calls on hosts (`ascent.cluster.hosts`): a call that raises, exits, hangs or kills its process
costs that item only; inline hosts keep the interface in this process."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
from ascent.envs.hosts import InlineHosts
from ascent.messages import Outcome


def misbehave(item: str) -> str:
    """A stand-in for user code: every way to fail, by name; anything else comes back doubled."""
    if item == "hang":
        time.sleep(600)
    if item == "exit":
        sys.exit(3)
    if item == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if item == "raise":
        raise ValueError("bad item")
    return item * 2


def pid_of(_: object) -> int:
    return os.getpid()


@pytest.fixture
def runner():
    r = ProcessHosts(2, IsolationPolicy("test", 1.0, "test.timeout_s"))
    yield r
    r.close()


def test_each_failure_costs_its_item_only(runner):
    items = ["a", "hang", "b", "exit", "c", "kill", "raise", "d"]
    out = runner.map(misbehave, items)
    assert [o.value for o in out if o.ok] == ["aa", "bb", "cc", "dd"]
    errors = {item: o.error for item, o in zip(items, out, strict=True) if not o.ok}
    assert errors["hang"] == "timed out after 1 s (test.timeout_s; its process was killed)"
    assert errors["exit"] == "SystemExit: 3"
    assert "killed by SIGKILL" in errors["kill"] or "died" in errors["kill"]
    assert errors["raise"] == "ValueError: bad item"
    # the pool replaced its dead and timed-out workers and keeps working
    assert [o.value for o in runner.map(misbehave, ["x"] * 50)] == ["xx"] * 50


def test_runs_outside_this_process_in_order_and_stops_its_workers(runner):
    out = runner.map(functools.partial(pid_of), list(range(40)))
    pids = {o.value for o in out}
    assert os.getpid() not in pids and len(pids) <= 2
    assert runner.map(misbehave, [str(i) for i in range(100)])[37].value == "3737"
    runner.close()
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_inline_hosts_have_the_same_interface():
    out = InlineHosts().map(misbehave, ["a", "raise", "exit"])
    assert out[0].value == "aa" and out[1].error == "ValueError: bad item" and out[2].error == "SystemExit: 3"
    assert InlineHosts().each(misbehave, ["b"]) == [Outcome.of(misbehave, "b")] == [Outcome(value="bb")]


def quiet_exit(item: str) -> str:
    """User code that ends its process with status 0 (no exception, no signal: only the process's end tells)."""
    if item == "os_exit":
        os._exit(0)
    return item * 2


@pytest.mark.timeout(60)
def test_a_worker_that_exits_with_status_0_costs_its_item_and_is_replaced():
    # a missed death would wait 120 s: the test's own timeout fails it
    runner = ProcessHosts(2, IsolationPolicy("reward", 120.0, "reward.timeout_s"))
    try:
        out = runner.map(quiet_exit, ["a", "os_exit", "b", "os_exit"])
        assert [o.value for o in out if o.ok] == ["aa", "bb"]
        for o in (out[1], out[3]):
            assert o.error == "its process died (exit code 0) while running a reward call"
        assert [o.value for o in runner.map(quiet_exit, ["x"] * 8)] == ["xx"] * 8  # the pool serves on
    finally:
        runner.close()


def test_hanging_calls_time_out_together_and_the_wait_says_so(caplog):
    # 6 hanging one-item chunks on 3 workers: two rounds of timeouts (each call timed once, never re-run)
    runner = ProcessHosts(3, IsolationPolicy("reward", 1.0, "reward.timeout_s", notice_s=0.5))
    try:
        with caplog.at_level(logging.INFO, logger="ascent.cluster.hosts"):
            out = runner.map(misbehave, ["hang"] * 6, detail="reward.fn=mypkg:score")
    finally:
        runner.close()
    assert all(o.error == "timed out after 1 s (reward.timeout_s; its process was killed)" for o in out)
    assert "waiting for 6 of 6 reward calls (reward.fn=mypkg:score), " in caplog.text
    assert "reward.timeout_s=1 s" in caplog.text
    assert caplog.text.count("timed out after 1 s") == 6  # each call timed once, never re-run


def fork_and(item: str) -> int:
    """User code that starts a child process (sleeping a minute), then returns its pid or hangs."""
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    if item == "hang":
        time.sleep(600)
    return child


def gone(pid: int) -> bool:
    """The process ended (a zombie not yet reaped by init counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pids: list[int], within_s: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


@pytest.mark.timeout(60)
def test_processes_user_code_started_end_with_its_host():
    # a reward that forks must not leave processes running after the call's host is replaced or closed
    runner = ProcessHosts(1, IsolationPolicy("reward", 1.0, "reward.timeout_s"))
    try:
        children = [o.value for o in runner.each(fork_and, ["a", "b"])]
        assert all(isinstance(c, int) for c in children)
        runner.each(fork_and, ["hang"])  # timed out: its host is replaced, with what it started
    finally:
        runner.close()
    assert wait_gone(children) == []


def slow_pid(_: object) -> int:
    time.sleep(1.0)
    return os.getpid()


# A controller in a session of its own: it keeps running through SIGTERM (its handler stops the run at the
# next safe point) while the signal goes to its whole process group, as Slurm's preemption, `timeout` and
# `kill -- -PGID` send it; prints the errors of the calls that were out at the time.
SIGTERM_THE_GROUP = """
import os, signal, threading
from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
from tests.unit.cluster.test_hosts import pid_of, slow_pid
signal.signal(signal.SIGTERM, lambda *_: None)
runner = ProcessHosts(2, IsolationPolicy("reward", 30.0, "reward.timeout_s"))
runner.map(pid_of, [0, 1])
threading.Timer(0.3, os.killpg, (0, signal.SIGTERM)).start()
out = runner.map(slow_pid, [0, 1])
runner.close()
print([o.error for o in out if not o.ok])
"""


@pytest.mark.timeout(60)
def test_a_sigterm_to_the_whole_process_group_leaves_the_calls_to_finish():
    # before: the fork server died of it, and every call out then failed ("exit code 255"), so the
    # iteration the controller finishes before its checkpoint failed its rewards and the run exited 2
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_THE_GROUP],
        cwd=root,
        env=env,
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


# A controller whose reward hangs; it prints its host's pid and is then killed with SIGKILL (no cleanup).
KILLED_CONTROLLER = """
import threading
from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
from tests.unit.cluster.test_hosts import misbehave
runner = ProcessHosts(1, IsolationPolicy("reward", 300.0, "reward.timeout_s"))
runner.map(misbehave, ["a"])
print(runner.pids()[0], flush=True)
runner.map(misbehave, ["hang"])
"""


@pytest.mark.timeout(60)
def test_a_host_stuck_in_user_code_ends_when_its_controller_is_killed():
    # hosts lead process groups of their own, so `kill -9 -- -PGID` of the job no longer reaches them:
    # a host still inside user code must end with the controller (parent-death signal), not run on
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_CONTROLLER], cwd=root, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        host = int(proc.stdout.readline())
        time.sleep(0.5)  # the hanging call is out
    finally:
        proc.kill()
        proc.wait()
    assert wait_gone([host], within_s=10.0) == []
