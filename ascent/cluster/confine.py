"""What a host process puts around the user code it runs (`ascent.cluster.hosts`): a memory limit and capped
output. Process hosts and Ray host actors set both up when they start, so a reward (an environment, an agent)
that allocates or prints without end costs its own call, never the machine's memory or the run's disk.

Memory: `limit_memory(mb)` sets RLIMIT_DATA, the process's private writable memory (heap, anonymous
mappings, thread stacks; not its shared libraries, files or address space merely reserved, so CUDA and big
virtual reservations still work), for the host and what it starts. Past it an allocation fails: Python
raises MemoryError, which costs the call (`IsolationPolicy.noted` names the setting) and the host serves on.

Output: user code's writes to stdout and stderr (file descriptors 1 and 2, so the processes it starts are
caught too) go through a pipe of this process that a thread drains at once into where they went before (the
controller's console or log file): a writer never blocks on the pipe, however much it prints. Each call may
print `head` bytes to each stream as it runs; past that, what it prints is counted and dropped but for its
last `tail` bytes, which `end_call` hands back as an `Overflow` for the controller to log with the count.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import resource
import select
import sys
import termios
import threading
import time
from dataclasses import dataclass

HEAD = 64 << 10  # bytes of each stream a call prints that pass as they come
TAIL = 8 << 10  # bytes of the rest that are kept, the last ones, for the log
SETTLE_S = 0.2  # how long `end_call` waits for what a call wrote to come out of the pipe


@dataclass(frozen=True)
class Overflow:
    """One stream of one call that printed past its cap: `head` bytes passed as they came, `dropped` more
    did not, and the last `kept` bytes of those are `tail` (decoded)."""

    stream: str  # "stdout" or "stderr"
    head: int
    dropped: int
    kept: int
    tail: str

    def describe(self, who: str) -> str:
        """A log entry: what `who` (e.g. "reward process 4242") printed past the cap, and its tail."""
        return (
            f"{who}: one call printed {_size(self.head + self.dropped)} to {self.stream}, over the "
            f"{_size(self.head)} a call may print; {_size(self.dropped)} of it dropped, of which the last "
            f"{_size(self.kept)} follow:\n{self.tail}"
        )


class CappedStream:
    """File descriptor `fd` (1 or 2) behind a pipe drained by a thread into where `fd` pointed before: each
    call's first `head` bytes as they come, then a count and the last `tail` bytes (see the module doc)."""

    def __init__(self, fd: int, name: str, head: int = HEAD, tail: int = TAIL) -> None:
        self.name, self.head, self.keep = name, head, tail
        self.target = os.dup(fd)
        self.pipe, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self.lock = threading.Lock()
        self.passed = self.dropped = 0
        self.tail = bytearray()
        threading.Thread(target=self._drain, name=f"capped-{name}", daemon=True).start()

    def _drain(self) -> None:
        """Wait for data without the lock, then read and pass it on under the lock: once `end_call` holds
        the lock with the pipe empty, every byte the call wrote has been counted as its own."""
        ready = select.poll()
        ready.register(self.pipe, select.POLLIN)
        while True:
            ready.poll()
            with self.lock:
                try:
                    data = os.read(self.pipe, 1 << 16)  # the only reader: readable, so it does not block
                except OSError:  # user code closed the descriptor
                    return
                if not data:
                    return
                self._feed(data)

    def _feed(self, data: bytes) -> None:
        room = max(0, self.head - self.passed)
        if room:
            _write_all(self.target, data[:room])
            self.passed += min(room, len(data))
        rest = data[room:]
        if rest:
            self.dropped += len(rest)
            self.tail += rest
            del self.tail[: max(0, len(self.tail) - self.keep)]

    def end_call(self) -> Overflow | None:
        """What the call that just ended dropped (None: nothing), once the pipe is empty (or after
        SETTLE_S: a process the call started may still be writing); the next call starts afresh."""
        deadline = time.monotonic() + SETTLE_S
        while _unread(self.pipe) and time.monotonic() < deadline:
            time.sleep(0.002)
        with self.lock:
            dropped, tail = self.dropped, bytes(self.tail)
            self.passed = self.dropped = 0
            self.tail.clear()
        if not dropped:
            return None
        return Overflow(self.name, self.head, dropped, len(tail), tail.decode("utf-8", "replace"))


class CappedOutput:
    """stdout and stderr of this process, each a `CappedStream`."""

    def __init__(self, head: int = HEAD, tail: int = TAIL) -> None:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        self.streams = [CappedStream(1, "stdout", head, tail), CappedStream(2, "stderr", head, tail)]

    def end_call(self) -> list[Overflow]:
        """The overflows of the call that just ended (usually none), after flushing Python's buffers."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):  # user code closed or replaced it
                stream.flush()
        return [o for o in (s.end_call() for s in self.streams) if o is not None]


def limit_memory(mb: int) -> None:
    """Cap this process's private writable memory (RLIMIT_DATA) at `mb` MiB, and at most its hard limit;
    0: no limit. The processes it starts inherit the limit, each its own."""
    if mb <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = mb << 20 if hard == resource.RLIM_INFINITY else min(mb << 20, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def is_memory_error(error: str | None) -> bool:
    """Whether an outcome's error text is an allocation that failed (MemoryError or a subclass, e.g.
    numpy's `_ArrayMemoryError`)."""
    return error is not None and error.split(":", 1)[0].endswith("MemoryError")


def _unread(fd: int) -> int:
    """Bytes waiting in pipe `fd` (0 when user code closed it)."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count)
    except OSError:
        return 0
    return count[0]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError:  # where it went is gone (a closed console): drop it
            return


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
