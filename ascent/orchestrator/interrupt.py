"""Stopping cleanly on SIGTERM and SIGINT: how Slurm and Kubernetes preempt, and how people press Ctrl-C.

The first signal only sets a flag and says so; the loop looks at it at its next safe point (after an
iteration or an SFT step), writes a checkpoint there when `checkpoint.on_interrupt` is on, and raises
`Interrupted`, which the CLI turns into one message and exit status 128 + signal number (130 for SIGINT,
143 for SIGTERM). A second signal stops at once (KeyboardInterrupt): the message then says only what is
true, i.e. which checkpoint exists, if any. Schedulers give a grace period between SIGTERM and SIGKILL
(Slurm: `--signal=B:TERM@120`, Kubernetes: `terminationGracePeriodSeconds`); make it longer than one
iteration plus a checkpoint.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from ascent.errors import AscentError

log = logging.getLogger("ascent")


class Interrupted(AscentError):
    """The run stopped at a safe point after a signal; `exit_code` is 128 + the signal number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class SignalStop(KeyboardInterrupt):
    """Raised inside the handler when stopping cannot wait for a safe point; carries the signal number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# what a stopped (not crashed) run raises: at a safe point, or at once on a second signal / Ctrl-C
STOPS: tuple[type[BaseException], ...] = (Interrupted, KeyboardInterrupt)


class StopFlag:
    """Set by the first SIGTERM/SIGINT once `arm()`ed (the loop has started); `signum` says which.

    Before `arm()` (loading the model, the data, the workers) there is nothing a checkpoint could save, so a
    signal stops at once; so does a second signal after the first.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.armed = False

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def arm(self) -> None:
        self.armed = True

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.armed or self.signum is not None:
            raise SignalStop(signum)
        self.signum = signum
        log.warning(
            "%s received: stopping at the end of this step (a checkpoint is written when "
            "checkpoint.on_interrupt is on); send it again to stop at once.",
            signal.Signals(signum).name,
        )


@contextmanager
def graceful_stop() -> Iterator[StopFlag]:
    """Install the SIGTERM/SIGINT handlers for the body (main thread only), restore the old ones after."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    old = {s: signal.signal(s, flag.handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def stopped_message(signum: int, what: str, checkpoint: str | None, done: int, total: int) -> Interrupted:
    """The error the loop raises after stopping at a safe point: where it stopped and what was saved."""
    name = signal.Signals(signum).name
    saved = (
        f"checkpoint {checkpoint} holds it; run the same command with --resume to continue."
        if checkpoint
        else "no checkpoint was written (checkpoint.on_interrupt=false)."
    )
    return Interrupted(f"stopped by {name} after {what} {done} of {total}; {saved}", signum)
