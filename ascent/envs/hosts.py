"""Hosts: where user code runs (rewards, environments, agents), and environments' view of them.

A host holds a dict of state and runs one command at a time: `serve(state, command) -> Outcome`. A command
is `(op, fn, args)`: `fn(state, *args)` with `fn` a module-level function (it travels to a process or a Ray
actor by name) and `op` naming it in messages ("step", "a reward call"). An exception in user code,
`sys.exit` included, is the command's error outcome; the host lives on.

`Hosts` is the contract every kind of host keeps: `run([(host, command)])` runs commands pinned to a host
(state that must stay where it was made: an environment) or on any free host (host None: stateless calls),
`map(fn, items)` / `each(fn, items)` are the stateless calls (`ascent.cluster.hosts`). `InlineHosts` is the
kind in this process (no isolation, no timeout, `breakpoint()` works); `ascent.cluster.hosts` runs hosts in
processes or Ray actors under one `IsolationPolicy` (a timeout per command; a host that hangs or dies is
replaced, and what it held is lost). The contract sits here, in the lowest layer that runs on hosts;
reward functions reach hosts through the executor the orchestrator hands their runner.

Environments on hosts: `HostedEnvs` places the episodes of a batch on the hosts in contiguous blocks (a
group's episodes together); each environment lives in its host for its whole life, made there from its
name (`reset`), so it keeps its state between turns as in-process. A finished batch's environments are
dropped (`drop`): hosts that outlive a batch (Ray actors) hold none of them afterwards.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ascent.envs.base import Action, Environment, Message, StepResult, first_message_problem, make_env
from ascent.messages import Outcome

Command = tuple[str, Callable[..., Any], tuple[Any, ...]]  # (op, fn, args): fn(state, *args)
LOST = "its environment was lost when its process was replaced (another episode there hung or crashed)"


def serve(state: dict[Any, Any], command: Command) -> Outcome:
    """What a host, of any kind, does with one command: fn(state, *args) as an Outcome."""
    _, fn, args = command
    return Outcome.of(fn, state, *args)


class Hosts(Protocol):
    """N hosts that run commands, one at a time each: `InlineHosts`, or `ascent.cluster.hosts`' process
    hosts and Ray actors. A command that times out or whose host dies gets an error outcome, naming why,
    and the host is replaced."""

    @property
    def num_hosts(self) -> int: ...

    def run(self, commands: Sequence[tuple[int | None, Command]], detail: str = "") -> list[Outcome]:
        """(host, command) pairs -> one outcome each, in order; host None: the first free host."""
        ...

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        """fn(item) for every item, on any hosts (a stateless call may run again after a failure)."""
        ...

    def each(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        """fn(item) for every item, each run once (calls with side effects, e.g. an agent's episodes)."""
        ...

    def close(self) -> None: ...


class InlineHosts:
    """One host: this process. No isolation and no timeout (`breakpoint()` works); Ctrl-C goes through."""

    num_hosts = 1

    def __init__(self) -> None:
        self.state: dict[Any, Any] = {}

    def run(self, commands: Sequence[tuple[int | None, Command]], detail: str = "") -> list[Outcome]:
        return [serve(self.state, command) for _, command in commands]

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        return [Outcome.of(fn, item) for item in items]

    def each(self, fn: Callable[[Any], Any], items: Sequence[Any], detail: str = "") -> list[Outcome]:
        return self.map(fn, items, detail)

    def close(self) -> None:
        self.state = {}


class EnvironmentLost(Exception):
    """The episode's environment went with a host that was replaced."""


def reset(state: dict[Any, Any], key: Any, env: Environment | str, row: Any) -> tuple[list[Message], Any]:
    """Make the environment (from its name, or as given inline), keep it under `key`, reset it on `row`."""
    made = state[key] = make_env(env) if isinstance(env, str) else env
    return checked_messages(made.reset(row), made), getattr(made, "tools", None)


def checked_messages(value: Any, env: Any) -> list[Message]:
    """`value`, when it is what `reset` must return (a list of messages, each as `message_problem` wants it);
    else a TypeError that says what it was (the runner reports it with the row, as a failed reset)."""
    if isinstance(value, list | tuple) and all(isinstance(m, Mapping) for m in value):
        found = first_message_problem(value)
        if found is not None:
            i, problem = found
            raise TypeError(
                f"{type(env).__name__}.reset returned message {i} {_shown(value[i])}, which {problem}"
            )
        return list(value)
    raise TypeError(
        f"{type(env).__name__}.reset returned {type(value).__name__} {_shown(value)}; it must return the "
        'conversation before the model\'s first turn, a list of messages like [{"role": "user", "content": ...}]'
    )


def _shown(value: Any) -> str:
    return repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."


def step(state: dict[Any, Any], key: Any, action: Action) -> StepResult:
    if key not in state:
        raise EnvironmentLost(LOST)
    result: StepResult = state[key].step(action)
    return result


def drop(state: dict[Any, Any], batch: Any) -> int:
    """Forget the environments of `batch` -> how many there were."""
    gone = [k for k in state if k[0] == batch]
    for k in gone:
        del state[k]
    return len(gone)


class HostedEnvs:
    """The environments of a batch (by name; instances too on `InlineHosts`) in `hosts`, in contiguous
    blocks: the episodes of one group share a host, so an environment that hangs or crashes costs mostly
    its own group. `reset` / `step` answer per episode its value or its error text; `close()` drops them."""

    _ids = itertools.count()

    def __init__(self, hosts: Hosts, envs: Sequence[Environment | str]) -> None:
        self.hosts, self.envs = hosts, list(envs)
        self.batch = next(self._ids)  # unique among the batches that share the hosts
        names = sorted({e if isinstance(e, str) else type(e).__name__ for e in self.envs})
        self.detail = f"env {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"  # for wait notices

    def host(self, i: int) -> int:
        return i * self.hosts.num_hosts // len(self.envs)

    def reset(self, rows: Sequence[Any]) -> list[tuple[list[Message], Any] | str]:
        pairs = enumerate(zip(self.envs, rows, strict=True))
        return self._run(
            [(self.host(i), ("reset", reset, ((self.batch, i), e, row))) for i, (e, row) in pairs]
        )

    def step(self, calls: Sequence[tuple[int, Action]]) -> list[StepResult | str]:
        return self._run([(self.host(i), ("step", step, ((self.batch, i), action))) for i, action in calls])

    def _run(self, commands: list[tuple[int | None, Command]]) -> list[Any]:
        return [o.value if o.ok else o.error for o in self.hosts.run(commands, self.detail)]

    def close(self) -> None:
        used = sorted({self.host(i) for i in range(len(self.envs))})
        self.hosts.run([(h, ("drop", drop, (self.batch,))) for h in used])
