"""The tracking bus: events reach every sink in order, a failing sink is logged once and dropped while the
others carry on, and `tracked_run` ends the run finished, interrupted or crashed."""

from __future__ import annotations

import logging

import pytest

from ascent.tracking import EventBus, Metrics, RunEnded, RunStarted, tracked_run


class Recorder:
    def __init__(self):
        self.events: list = []
        self.closed = 0

    def handle(self, event):
        self.events.append(event)

    def close(self):
        self.closed += 1


class Broken(Recorder):
    """Fails on its second event."""

    def handle(self, event):
        super().handle(event)
        if len(self.events) == 2:
            raise OSError("disk full")


def started(**kw) -> RunStarted:
    return RunStarted("/tmp/run", "train", {"seed": 1}, total_steps=3, **kw)


def test_events_arrive_in_order_and_are_frozen():
    rec = Recorder()
    bus = EventBus([rec])
    bus.publish(started())
    bus.publish(Metrics.of(1, {"a": 1.0}))
    bus.publish(RunEnded("finished"))
    assert [type(e).__name__ for e in rec.events] == ["RunStarted", "Metrics", "RunEnded"]
    with pytest.raises(AttributeError):
        rec.events[1].step = 5


def test_metrics_of_makes_plain_scalars():
    import torch

    m = Metrics.of(2, {"t": torch.tensor(0.5), "nan": float("nan"), "flag": False, "name": "x"})
    assert m.values == {"t": 0.5, "nan": None, "flag": 0, "name": "x"} and m.step == 2


def test_a_failing_sink_is_logged_once_and_dropped_the_others_continue(caplog):
    good, bad = Recorder(), Broken()
    bus = EventBus([bad])
    bus.subscribe(good)
    with caplog.at_level(logging.ERROR, logger="ascent.tracking.events"):
        for step in range(1, 5):
            bus.publish(Metrics.of(step, {"x": step}))
    assert [e.step for e in good.events] == [1, 2, 3, 4]
    assert [e.step for e in bad.events] == [1, 2]  # nothing after the failure
    failures = [r for r in caplog.records if "Broken failed" in r.getMessage()]
    assert len(failures) == 1 and "disk full" in caplog.text
    assert bus.sinks == (good,) and bad.closed == 1
    bus.close()
    bus.close()
    assert good.closed == 1 and bad.closed == 1  # each sink closed once


def test_a_failing_close_does_not_stop_the_others():
    class BadClose(Recorder):
        def close(self):
            raise RuntimeError("no")

    good = Recorder()
    bus = EventBus([BadClose(), good])
    bus.close()
    assert good.closed == 1


class Stop(Exception):
    pass


def test_tracked_run_finished():
    rec = Recorder()
    with tracked_run(EventBus([rec]), started()) as bus:
        bus.publish(Metrics.of(1, {"x": 1}))
    assert rec.events[-1].state == "finished" and rec.events[-1].error is None and rec.closed == 1


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), Stop("stopped by SIGTERM after iteration 1 of 3")])
def test_tracked_run_interrupted(exc):
    rec = Recorder()
    with pytest.raises(type(exc)), tracked_run(EventBus([rec]), started(), (Stop, KeyboardInterrupt)):
        raise exc
    assert rec.events[-1] == RunEnded("interrupted", time=rec.events[-1].time) and rec.closed == 1


def test_tracked_run_crashed_with_a_one_line_error():
    rec = Recorder()
    with pytest.raises(ValueError), tracked_run(EventBus([rec]), started()):
        raise ValueError("bad shape\nlong detail")
    end = rec.events[-1]
    assert end.state == "crashed" and end.error == "ValueError: bad shape"
