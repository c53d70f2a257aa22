"""Environments in their own processes: a hang, a crash or `sys.exit` in user code costs episodes, not the
run.

`EnvHosts(num_hosts, timeout_s)` starts `num_hosts` worker processes (forkserver: they never inherit the
caller's threads). The episodes of a batch are spread over the hosts in contiguous blocks (a group's episodes
together) and each lives in its host for its whole life, created there
from its environment's name (`make_env`), so environments keep their state between turns as in-process.
Hosts work in parallel, one command at a time each; every command has `timeout_s`. A command that times out
or whose host dies ends that episode with the reason, the host is replaced, and the other episodes it held
end too ("lost with its process"): an environment cannot be moved out of a process that is gone.
`HostedEnvs` is the runner's view of any `Hosts` (`reset` / `step` for a batch), `InProcessEnvs` the same in
this process (no isolation, `breakpoint()` works).

`serve` is what a host does with one command, whatever the host is: these processes, or the Ray actors of
`ascent.cluster.env_actors` (`cluster.backend=ray`), which keep the same contract (`Hosts`) and live for the
whole run. A batch's environments are keyed by the batch (`HostedEnvs` has its own id) and dropped when it
ends, so hosts that outlive a batch hold none of its environments afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import pickle
import time
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from ascent.envs.base import Message, StepResult, make_env

LOST = "its environment was lost when its process was replaced (another episode there hung or crashed)"


def serve(envs: dict[Any, Any], msg: tuple[str, Any, Any]) -> tuple[str, Any]:
    """One command on a host's environments `envs` (keyed by (batch, episode)):
    ("reset", key, (name, row)) -> ("ok", (messages, tools)); ("step", key, action) -> ("ok", StepResult);
    ("drop", batch, None) forgets the batch's environments -> ("ok", count). Errors -> ("err", text)."""
    op, key, arg = msg
    try:
        if op == "reset":
            env = envs[key] = make_env(arg[0])
            return ("ok", (env.reset(arg[1]), getattr(env, "tools", None)))
        if op == "drop":
            gone = [k for k in envs if k[0] == key]
            for k in gone:
                del envs[k]
            return ("ok", len(gone))
        if key not in envs:
            return ("err", LOST)
        return ("ok", envs[key].step(arg))
    except BaseException as e:  # noqa: BLE001 - user code: SystemExit costs the episode only
        return ("err", f"{type(e).__name__}: {e}")


def _host_main(conn: Connection) -> None:
    """A host process's loop: each command in, `serve`'s reply out (or why it cannot travel)."""
    envs: dict[Any, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        reply = serve(envs, msg)
        try:
            data = pickle.dumps(reply)
        except Exception as e:  # noqa: BLE001 - user code's answer (e.g. a lambda in info): costs the episode
            data = pickle.dumps(("err", f"its {msg[0]} answer cannot be sent back ({type(e).__name__}: {e})"))
        conn.send_bytes(data)


class Hosts(Protocol):
    """Where environments live, one command at a time per host: `EnvHosts` (processes) or
    `ascent.cluster.env_actors.RayEnvHosts` (Ray actors)."""

    @property
    def num_hosts(self) -> int: ...

    def run(self, commands: Sequence[tuple[int, tuple[str, Any, Any]]]) -> list[tuple[str, Any]]:
        """(host, command) pairs -> one reply each, in order (see `serve`); a command that times out or
        whose host dies gets ("err", why) and the host is replaced."""
        ...


class EnvHosts:
    """`num_hosts` processes holding environments; commands time out after `timeout_s` (see module doc)."""

    def __init__(self, num_hosts: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._ctx = multiprocessing.get_context("forkserver")
        self._hosts: list[tuple[Any, Connection]] = [self._start() for _ in range(num_hosts)]

    def _start(self) -> tuple[Any, Connection]:
        mine, theirs = self._ctx.Pipe()
        proc = self._ctx.Process(target=_host_main, args=(theirs,), daemon=True)
        proc.start()
        theirs.close()
        return proc, mine

    def _replace(self, h: int) -> None:
        proc, conn = self._hosts[h]
        proc.kill()
        proc.join(5)
        conn.close()
        self._hosts[h] = self._start()

    @property
    def num_hosts(self) -> int:
        return len(self._hosts)

    def run(self, commands: Sequence[tuple[int, tuple[str, Any, Any]]]) -> list[tuple[str, Any]]:
        """(host, message) pairs -> one reply each, in order; hosts run in parallel, each in order. A host
        is waited on through its pipe and its process, so one that exits (with any status, 0 included) is
        noticed at once, even when a child it started holds its end of the pipe open."""
        queues: dict[int, deque[tuple[int, tuple[str, Any, Any]]]] = {}
        for i, (h, msg) in enumerate(commands):
            queues.setdefault(h, deque()).append((i, msg))
        out: list[tuple[str, Any]] = [("err", "not run")] * len(commands)
        busy: dict[int, tuple[int, float]] = {}  # host -> (command index, deadline)
        ops = [msg[0] for _, msg in commands]
        while any(queues.values()) or busy:
            for h, q in queues.items():
                if h not in busy and q:
                    i, msg = q.popleft()
                    busy[h] = (i, time.monotonic() + self.timeout_s)
                    with contextlib.suppress(OSError):  # it died since its last command: the wait says so
                        self._hosts[h][1].send(msg)
            waits = {self._hosts[h][1]: h for h in busy} | {self._hosts[h][0].sentinel: h for h in busy}
            soonest = min(deadline for _, deadline in busy.values())
            for h in {waits[r] for r in wait(list(waits), timeout=max(0.0, soonest - time.monotonic()))}:
                i, _ = busy.pop(h)
                out[i] = self._reply(h, ops[i])
            for h, (i, deadline) in list(busy.items()):
                if time.monotonic() > deadline:
                    out[i] = (
                        "err",
                        f"the environment timed out after {self.timeout_s:g} s (its process was killed)",
                    )
                    busy.pop(h)
                    self._replace(h)
        return out

    def _reply(self, h: int, op: str) -> tuple[str, Any]:
        """Host `h`'s answer to its command `op`, or why there is none (its process died: replaced)."""
        proc, conn = self._hosts[h]
        try:
            if conn.poll():
                reply: tuple[str, Any] = conn.recv()
                return reply
        except (EOFError, OSError):
            pass
        except Exception as e:  # noqa: BLE001 - the answer arrived but cannot be read here (unpickling)
            return ("err", f"its {op} answer cannot be read ({type(e).__name__}: {e})")
        proc.join(1)  # reap it, for its exit status
        self._replace(h)
        return ("err", f"its environment process died (exit code {proc.exitcode}) while running {op}")

    def close(self) -> None:
        for proc, conn in self._hosts:
            conn.close()
            proc.kill()
            proc.join(5)
        self._hosts = []


class InProcessEnvs:
    """The environments of a batch as given (instances), called in this process."""

    def __init__(self, envs: Sequence[Any]) -> None:
        self.envs = list(envs)

    def reset(self, rows: Sequence[Any]) -> list[tuple[list[Message], Any] | str]:
        out: list[tuple[list[Message], Any] | str] = []
        for env, row in zip(self.envs, rows, strict=True):
            try:
                out.append((env.reset(row), getattr(env, "tools", None)))
            except Exception as e:
                out.append(f"{type(e).__name__}: {e}")
        return out

    def step(self, calls: Sequence[tuple[int, str]]) -> list[StepResult | str]:
        out: list[StepResult | str] = []
        for i, action in calls:
            try:
                out.append(self.envs[i].step(action))
            except Exception as e:  # user code: it costs this episode, never the batch
                out.append(f"{type(e).__name__}: {e}")
        return out

    def close(self) -> None:
        self.envs = []


class HostedEnvs:
    """The environments of a batch (by name) in `hosts`, in contiguous blocks: the episodes of one group
    share a host, so an environment that hangs or crashes costs mostly its own group. `close()` drops them
    from the hosts (hosts that outlive the batch, Ray actors, would keep them otherwise)."""

    _ids = itertools.count()

    def __init__(self, hosts: Hosts, names: Sequence[str]) -> None:
        self.hosts, self.names = hosts, list(names)
        self.batch = next(self._ids)  # unique among the batches that share the hosts

    def host(self, i: int) -> int:
        return i * self.hosts.num_hosts // len(self.names)

    def reset(self, rows: Sequence[Any]) -> list[tuple[list[Message], Any] | str]:
        pairs = enumerate(zip(self.names, rows, strict=True))
        return self._run([(self.host(i), ("reset", (self.batch, i), (n, row))) for i, (n, row) in pairs])

    def step(self, calls: Sequence[tuple[int, str]]) -> list[StepResult | str]:
        return self._run([(self.host(i), ("step", (self.batch, i), action)) for i, action in calls])

    def _run(self, commands: list[tuple[int, tuple[str, Any, Any]]]) -> list[Any]:
        return [value for _, value in self.hosts.run(commands)]

    def close(self) -> None:
        used = sorted({self.host(i) for i in range(len(self.names))})
        self.hosts.run([(h, ("drop", self.batch, None)) for h in used])
