"""The tracking event bus: the run publishes typed events, sinks (JSONL, TensorBoard, W&B, MLflow,
status.json, the studio) subscribe to them.

A run publishes `RunStarted` once, then one `Metrics` per step, then `RunEnded` however it ends (see
`tracked_run`). A sink is any object with `handle(event)` and `close()`. Opening a sink (connecting to a
server, checking a package) happens in its constructor, at start-up, where a failure stops the run with a
message naming the field; once the run is going, a tracker can never take it down: a sink that raises is
logged once and disabled, and the others carry on.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)

RunKind = Literal["train", "sft"]
EndState = Literal["finished", "crashed", "interrupted"]
Scalar = float | int | str | None


def to_scalar(value: Any) -> float | int | str | None:
    """A metric value as something JSON can hold: finite number, None (non-finite/empty) or a string."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str) or value is None:
        return value
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return str(value)
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class RunStarted:
    """The run is set up and about to take its first step. `resume_step`: the step a resumed run continues
    from (0 for a fresh run); what an earlier process logged after it is dropped by the sinks that can."""

    run_dir: str
    kind: RunKind
    config: Mapping[str, Any]  # the resolved config as plain JSON types
    total_steps: int | None
    resume_step: int = 0
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Metrics:
    """The scalar metrics of one step (an RL iteration, an SFT optimizer step; step 0: validation before
    training). Values are finite numbers, None (non-finite) or strings; build with `Metrics.of`."""

    step: int
    values: Mapping[str, Scalar]
    time: float = field(default_factory=time.time)

    @classmethod
    def of(cls, step: int, values: Mapping[str, Any]) -> Metrics:
        """Metrics from anything the loop computed (tensors, numpy numbers, NaN) as plain scalars."""
        return cls(int(step), {str(k): to_scalar(v) for k, v in values.items()})


@dataclass(frozen=True)
class RunEnded:
    """The run is over: `finished`, `interrupted` (Ctrl-C, SIGTERM) or `crashed` with `error`, one line."""

    state: EndState
    error: str | None = None
    time: float = field(default_factory=time.time)


Event = RunStarted | Metrics | RunEnded


class Sink(Protocol):
    """Receives every event of the run in order; `close()` flushes and releases what it holds."""

    def handle(self, event: Event) -> None: ...

    def close(self) -> None: ...


class EventBus:
    """Deliver events to sinks in publication order. A sink that raises is logged once and dropped."""

    def __init__(self, sinks: list[Sink] | tuple[Sink, ...] = ()) -> None:
        self._sinks: list[Sink] = list(sinks)
        self._closed: list[Sink] = []
        self._lock = threading.RLock()  # re-entrant: a handler may itself publish

    @property
    def sinks(self) -> tuple[Sink, ...]:
        """The sinks still receiving events."""
        return tuple(self._sinks)

    def subscribe(self, sink: Sink) -> None:
        with self._lock:
            self._sinks.append(sink)

    def publish(self, event: Event) -> None:
        with self._lock:
            for sink in list(self._sinks):
                try:
                    sink.handle(event)
                except Exception:
                    log.exception(
                        "tracking sink %s failed on %s; it is disabled for the rest of the run",
                        type(sink).__name__,
                        type(event).__name__,
                    )
                    self._sinks.remove(sink)
                    self._close(sink)

    def close(self) -> None:
        """Close every sink (a failing close is logged). Safe to call twice."""
        with self._lock:
            sinks, self._sinks = self._sinks, []
            for sink in sinks:
                self._close(sink)

    def _close(self, sink: Sink) -> None:
        if any(s is sink for s in self._closed):
            return
        self._closed.append(sink)
        try:
            sink.close()
        except Exception:
            log.exception("tracking sink %s failed to close", type(sink).__name__)


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, at most 500 characters."""
    text = str(exc).strip().splitlines()
    message = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return message[:500]


@contextmanager
def tracked_run(
    bus: EventBus, started: RunStarted, interrupted: tuple[type[BaseException], ...] = (KeyboardInterrupt,)
) -> Iterator[EventBus]:
    """Publish `started`, run the body, then publish how it ended and close the bus.

    An exception of a type in `interrupted` (the caller passes its own stop exception besides Ctrl-C's
    KeyboardInterrupt) ends the run `interrupted`; any other one `crashed` with its one-line message. The
    exception propagates either way.
    """
    try:
        bus.publish(started)
        yield bus
    except interrupted:
        bus.publish(RunEnded("interrupted"))
        raise
    except BaseException as exc:
        bus.publish(RunEnded("crashed", error=one_line(exc)))
        raise
    else:
        bus.publish(RunEnded("finished"))
    finally:
        bus.close()
