"""The one mechanism that runs user code in isolation (design: "Every source is an environment"): hosts.

Reward functions, environments and agents all run on hosts (the contract: `ascent.envs.hosts.Hosts`): N
workers that each hold state and run one command at a time. A host is a forkserver process
(`ProcessHosts`, here), a Ray actor (`ascent.cluster.ray_hosts.RayHosts`) or this process
(`ascent.envs.hosts.InlineHosts`: no isolation, `breakpoint()` works). Environments pin their commands to
the host that holds them (`run`); rewards and agents are stateless calls on any free host (`map`, `each`).

One `IsolationPolicy` (a frozen record: what the calls are, `timeout_s` and the field that sets it, when
to say that a wait is long) governs every isolated host, in one scheduler (`HostPool`): each command gets
`timeout_s` from when its host takes it, so N hanging calls on W hosts cost about ceil(N / W) timeouts.
A command that raises (`sys.exit` included) costs its own outcome and the host serves on. A command that
times out, or whose host dies with any exit status (0 too: the wait watches the process, not only its
pipe), costs its outcome, "timed out after 30 s (reward.timeout_s; its process was killed)" or "its
process died (exit code 0) while running a reward call", and the host is replaced: what it held is lost
(an environment's other episodes there end "lost with its process"). While commands are out past
`notice_s`, the log says how many, for what and for how long, every `notice_s`.

A process host also caps its memory (`memory_mb`, RLIMIT_DATA: an allocation past it is a MemoryError that
costs the call, naming `memory_field`) and what each call prints (its first 64 KiB of stdout and of stderr
pass as they come; past that the log gets how much was dropped and its last 8 KiB): `ascent.cluster.confine`.

`map` sends items in chunks (one round trip per chunk); a chunk that fails as a whole (a timeout, a death,
an answer that cannot travel) is run again one item at a time, so the failure is pinned on exactly the
items that cause it. `each` runs every item once (an agent's episodes have side effects).

pebble is gone: its pool killed a timed-out task's process and noticed dead workers, but not one that
exited with status 0, and it could not hold state between calls; this scheduler does all of that for both
kinds of user code with the standard library, waiting on each host's pipe and process sentinel at once.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from ascent.cluster.confine import CappedOutput, Overflow, is_memory_error, limit_memory
from ascent.envs.hosts import Command, serve
from ascent.messages import Outcome

MAX_CHUNK = 64
FORKSERVER_INIT = "ascent.cluster.forkserver_init"  # SIGTERM is the controller's (see that module)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IsolationPolicy:
    """How long a command of user code may take, and how its failures read: one record per kind of user
    code (`what`: "reward", "environment", "agent"), the same rules for all (see the module doc).
    `timeout_field` names the knob that sets `timeout_s` in every message that quotes it."""

    what: str
    timeout_s: float
    timeout_field: str
    notice_s: float = 5.0
    memory_mb: int = 0  # a process host's memory limit (0: none), set by `memory_field`
    memory_field: str = ""

    @property
    def a_call(self) -> str:
        return f"a {self.what} call"

    def timed_out(self, host: str) -> str:
        return f"timed out after {self.timeout_s:g} s ({self.timeout_field}; its {host} was killed)"

    def died(self, host: str, how: str, op: str) -> str:
        return f"its {host} died ({how}) while running {op}"

    def noted(self, outcome: Outcome) -> Outcome:
        """`outcome` with a MemoryError (its own, or a chunk's items') saying what limits the memory."""
        if is_memory_error(outcome.error) and self.memory_mb:
            note = f"over the {self.memory_mb} MiB each {self.what} process may use: {self.memory_field}"
            return Outcome(error=f"{outcome.error} ({note})")
        if outcome.ok and isinstance(outcome.value, list):
            return Outcome(value=[self.noted(o) if isinstance(o, Outcome) else o for o in outcome.value])
        return outcome


def call_chunk(state: dict[Any, Any], fn: Callable[[Any], Any], items: list[Any]) -> list[Outcome]:
    """A host command: fn(item) for every item, each failure its own outcome."""
    return [Outcome.of(fn, item) for item in items]


def call_one(state: dict[Any, Any], fn: Callable[[Any], Any], item: Any) -> Any:
    """A host command: fn(item) (its failure is the command's)."""
    return fn(item)


class HostPool(ABC):
    """The scheduler every isolated kind of host shares (see the module doc). A kind provides `num_hosts`,
    `_open` (start its hosts if need be), `_submit`, `_ready`, `_answer`, `_replace` and `close`."""

    host = "process"  # what one host is, in messages ("its process was killed")

    def __init__(self, policy: IsolationPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()  # one run at a time (the collector's thread and the controller's)

    @property
    @abstractmethod
    def num_hosts(self) -> int: ...

    def run(self, commands: Sequence[tuple[int | None, Command]], detail: str = "") -> list[Outcome]:
        """(host, command) pairs -> one outcome each, in order; hosts run in parallel, each in order; host
        None: the first free host. `detail` says what the commands run, for the wait's log lines."""
        with self._lock:
            self._open()
            return self._run(list(commands), detail)

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        """fn(item) for every item -> one outcome each, in order (chunked; see the module doc)."""
        if not items:
            return []
        size = max(1, min(MAX_CHUNK, -(-len(items) // (self.num_hosts * 4))))
        chunks = [list(items[i : i + size]) for i in range(0, len(items), size)]
        done = self.run([(None, (self.policy.a_call, call_chunk, (fn, c))) for c in chunks], detail)
        retry = [item for c, o in zip(chunks, done, strict=True) if not o.ok and len(c) > 1 for item in c]
        again = iter(self.each(fn, retry, detail))
        out: list[Outcome] = []
        for c, o in zip(chunks, done, strict=True):
            out += o.value if o.ok else [o] if len(c) == 1 else [next(again) for _ in c]
        return out

    def each(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        """fn(item) for every item, one command each, never run twice."""
        return self.run([(None, (self.policy.a_call, call_one, (fn, item))) for item in items], detail)

    def _run(self, commands: list[tuple[int | None, Command]], detail: str) -> list[Outcome]:
        pinned: dict[int, deque[int]] = {}
        free: deque[int] = deque()
        for i, (h, _) in enumerate(commands):
            (free if h is None else pinned.setdefault(h, deque())).append(i)
        out: list[Outcome] = [Outcome(error="not run")] * len(commands)
        busy: dict[int, tuple[int, float]] = {}  # host -> (command index, deadline)
        notice = Notice(self.policy, len(commands), detail)
        while free or any(pinned.values()) or busy:
            for h in range(self.num_hosts):
                queue = pinned.get(h) or free
                if h in busy or not queue:
                    continue
                i = queue.popleft()
                refused = self._submit(h, commands[i][1])
                if refused is not None:
                    out[i] = refused
                else:
                    busy[h] = (i, time.monotonic() + self.policy.timeout_s)
            if not busy:
                continue
            until = min(min(deadline for _, deadline in busy.values()), notice.due)
            for h in self._ready(list(busy), max(0.0, until - time.monotonic())):
                i, _ = busy.pop(h)
                out[i] = self._answer(h, commands[i][1][0])
            now = time.monotonic()
            for h, (i, deadline) in list(busy.items()):
                if now > deadline and not self._ready([h], 0.0):  # not one that answered meanwhile
                    busy.pop(h)
                    out[i] = Outcome(error=self.policy.timed_out(self.host))
                    log.info("%s %s %d: %s; replacing it", self.policy.what, self.host, h, out[i].error)
                    self._replace(h)
            notice.tick(len(busy) + len(free) + sum(len(q) for q in pinned.values()))
        return out

    def _died(self, h: int, how: str, op: str) -> Outcome:
        """The outcome of a command whose host `h` died; the host is replaced."""
        error = self.policy.died(self.host, how, op)
        log.info("%s %s %d: %s; replacing it", self.policy.what, self.host, h, error)
        self._replace(h)
        return Outcome(error=error)

    # what a kind of host provides ------------------------------------------------------------------
    @abstractmethod
    def _open(self) -> None:
        """Start the hosts, if they are not running."""

    @abstractmethod
    def _submit(self, h: int, command: Command) -> Outcome | None:
        """Send `command` to host `h` (idle); an outcome when it cannot be sent (it does not pickle)."""

    @abstractmethod
    def _ready(self, hosts: list[int], timeout: float) -> list[int]:
        """Those of `hosts` whose command ended (answered, or the host died), waiting up to `timeout`."""

    @abstractmethod
    def _answer(self, h: int, op: str) -> Outcome:
        """Host `h`'s answer to its command `op` (ready), or why there is none (it died: `_died`)."""

    @abstractmethod
    def _replace(self, h: int) -> None:
        """Kill host `h` (if it lives) and start another in its place."""

    @abstractmethod
    def close(self) -> None:
        """Stop every host."""


class Notice:
    """Past `policy.notice_s`, every `notice_s`: the log says how many of a run's commands are still out."""

    def __init__(self, policy: IsolationPolicy, total: int, detail: str) -> None:
        self.policy, self.total, self.detail = policy, total, detail
        self.t0 = time.monotonic()
        self.due = self.t0 + policy.notice_s

    def tick(self, pending: int) -> None:
        now = time.monotonic()
        if pending and now >= self.due:
            self.due = now + self.policy.notice_s
            p = self.policy
            about = f" ({self.detail})" if self.detail else ""
            log.warning(
                "waiting for %d of %d %s calls%s, %.0f s so far; each may take %s=%g s",
                pending,
                self.total,
                p.what,
                about,
                now - self.t0,
                p.timeout_field,
                p.timeout_s,
            )


def host_main(conn: Connection, controller: int, policy: IsolationPolicy) -> None:
    """A host process's loop: each command in, `serve`'s outcome out (or why it cannot travel) with what
    the call printed past its cap (`Overflow`s). Ctrl-C is the controller's to handle (it stops at a safe
    point), so the host ignores SIGINT. The host leads a process group of its own, so that whatever user code
    starts (a fork, a subprocess) ends with the host (`kill_host`), not after the run, and a watcher ends
    that group when the `controller` process is gone (killed without closing its hosts) while user code
    still runs. Its memory and output are capped (`ascent.cluster.confine`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setpgid(0, 0)
    threading.Thread(target=watch_controller, args=(controller,), daemon=True).start()
    limit_memory(policy.memory_mb)
    output = CappedOutput()
    state: dict[Any, Any] = {}
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            return
        op = "its command"
        try:
            command: Command = pickle.loads(data)
            op = command[0]
            reply = serve(state, command)
        except Exception as e:  # noqa: BLE001 - a command this process cannot read (unpickling)
            reply = Outcome(error=f"{op} cannot be read in its process ({type(e).__name__}: {e})")
        overflows = output.end_call()
        try:
            out = pickle.dumps((policy.noted(reply), overflows))
        except Exception as e:  # noqa: BLE001 - user code's answer (e.g. a lambda in info): costs the call
            error = f"its answer to {op} cannot be sent back ({type(e).__name__}: {e})"
            out = pickle.dumps((policy.noted(Outcome(error=error)), overflows))
        conn.send_bytes(out)


class ProcessHosts(HostPool):
    """`num_hosts` forkserver processes (they never inherit the controller's threads), started on the first
    command and again after `close()`; `preload` modules are imported once in the fork server, after
    `FORKSERVER_INIT` (a SIGTERM to the whole job is the controller's to act on)."""

    def __init__(self, num_hosts: int, policy: IsolationPolicy, *, preload: Sequence[str] = ()) -> None:
        super().__init__(policy)
        self._n, self.preload = num_hosts, list(preload)
        self._ctx = multiprocessing.get_context("forkserver")
        self._hosts: list[tuple[Any, Connection]] = []

    @property
    def num_hosts(self) -> int:
        return self._n

    def pids(self) -> list[int]:
        return [proc.pid for proc, _ in self._hosts]

    def _open(self) -> None:
        if not self._hosts:
            self._ctx.set_forkserver_preload([FORKSERVER_INIT, *self.preload])
            self._hosts = [self._start() for _ in range(self._n)]

    def _start(self) -> tuple[Any, Connection]:
        mine, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=host_main, args=(theirs, os.getpid(), self.policy), daemon=True)
        proc.start()
        theirs.close()
        return proc, mine

    def _submit(self, h: int, command: Command) -> Outcome | None:
        try:
            data = pickle.dumps(command)
        except Exception as e:  # noqa: BLE001 - e.g. a lambda among the items
            return Outcome(error=f"{command[0]} cannot be sent to its process ({type(e).__name__}: {e})")
        with contextlib.suppress(OSError):  # it died since its last command: the wait says so
            self._hosts[h][1].send_bytes(data)
        return None

    def _ready(self, hosts: list[int], timeout: float) -> list[int]:
        """A host is waited on through its pipe and its process, so one that exits (with any status, 0
        included) is noticed at once, even when a child it started holds its end of the pipe open."""
        waits = {self._hosts[h][1]: h for h in hosts} | {self._hosts[h][0].sentinel: h for h in hosts}
        return sorted({waits[r] for r in wait(list(waits), timeout=timeout)})

    def _answer(self, h: int, op: str) -> Outcome:
        proc, conn = self._hosts[h]
        try:
            if conn.poll():
                reply: Outcome
                overflows: list[Overflow]
                reply, overflows = conn.recv()
                for overflow in overflows:
                    log.warning("%s", overflow.describe(f"{self.policy.what} {self.host} {proc.pid}"))
                return reply
        except (EOFError, OSError):
            pass
        except Exception as e:  # noqa: BLE001 - the answer arrived but cannot be read here (unpickling)
            return Outcome(error=f"its answer to {op} cannot be read ({type(e).__name__}: {e})")
        proc.join(1)  # reap it, for its exit status
        return self._died(h, exit_text(proc.exitcode), op)

    def _replace(self, h: int) -> None:
        proc, conn = self._hosts[h]
        kill_host(proc)
        conn.close()
        self._hosts[h] = self._start()

    def close(self) -> None:
        """Stop the processes (killing any still running); the next command starts new ones."""
        for proc, conn in self._hosts:
            conn.close()
            kill_host(proc)
        self._hosts = []


def watch_controller(pid: int, every_s: float = 1.0) -> None:
    """In a host: once the controller `pid` is gone, kill this host's process group. An idle host ends by
    itself (its pipe closes), but one inside user code (a reward that hangs) would run on, and its group no
    longer gets the signals of the controller's."""
    while process_alive(pid):
        time.sleep(every_s)
    os.killpg(0, signal.SIGKILL)


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (dead, waiting for its parent to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc (not Linux): existence is all we can tell


def kill_host(proc: Any) -> None:
    """Kill a host process and every process of its group (what its user code started), then reap it. The
    group outlives its leader while a member lives, so its id is not reused before this kill."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.kill()
    proc.join(5)


def exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def default_workers(requested: int | None) -> int:
    """`requested`, or min(4, CPUs) when None."""
    return requested if requested else max(1, min(4, os.cpu_count() or 1))
