"""The isolated runner: a call that raises, exits, hangs or kills its process costs that item only."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time

import pytest

from ascent.cluster.isolated import InlineRunner, IsolatedRunner, apply_one


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
    r = IsolatedRunner(2, timeout_s=1.0)
    yield r
    r.close()


def test_each_failure_costs_its_item_only(runner):
    items = ["a", "hang", "b", "exit", "c", "kill", "raise", "d"]
    out = runner.map(misbehave, items)
    assert [o.value for o in out if o.ok] == ["aa", "bb", "cc", "dd"]
    errors = {item: o.error for item, o in zip(items, out, strict=True) if not o.ok}
    assert "timed out after 1 s" in errors["hang"]
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


def test_inline_runner_has_the_same_interface():
    out = InlineRunner().map(misbehave, ["a", "raise", "exit"])
    assert out[0].value == "aa" and out[1].error == "ValueError: bad item" and out[2].error == "SystemExit: 3"
    assert apply_one(misbehave, "b").value == "bb"


def quiet_exit(item: str) -> str:
    """User code that ends its process with status 0 (pebble does not count that as a death)."""
    if item == "os_exit":
        os._exit(0)
    return item * 2


@pytest.mark.timeout(60)
def test_a_worker_that_exits_with_status_0_costs_its_item_and_is_replaced():
    runner = IsolatedRunner(
        2, timeout_s=120.0
    )  # a missed death would wait 120 s: the test's timeout fails it
    try:
        out = runner.map(quiet_exit, ["a", "os_exit", "b", "os_exit"])
        assert [o.value for o in out if o.ok] == ["aa", "bb"]
        for o in (out[1], out[3]):
            assert o.error == "its process died (exit code 0) while running a call"
        assert [o.value for o in runner.map(quiet_exit, ["x"] * 8)] == ["xx"] * 8  # the pool serves on
    finally:
        runner.close()


def test_hanging_calls_time_out_together_and_the_wait_says_so(caplog):
    # 6 hanging one-item chunks on 3 workers: two rounds of timeouts (each call timed once, never re-run)
    runner = IsolatedRunner(3, timeout_s=1.0, what="reward", timeout_field="reward.timeout_s", notice_s=0.5)
    try:
        with caplog.at_level(logging.WARNING, logger="ascent.cluster.isolated"):
            out = runner.map(misbehave, ["hang"] * 6, detail="reward.fn=mypkg:score")
    finally:
        runner.close()
    assert all(o.error == "timed out after 1 s (reward.timeout_s; its process was killed)" for o in out)
    assert "waiting for 6 of 6 reward calls (reward.fn=mypkg:score), " in caplog.text
    assert "reward.timeout_s=1 s" in caplog.text
