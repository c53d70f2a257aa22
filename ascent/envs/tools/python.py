"""A Python tool for agents: run untrusted code in a sandbox and return what it printed.

Each call runs `python -I -S -c code` (the standard library only, no environment variables but a minimal PATH)
in a bubblewrap sandbox of its own (`ascent.envs.tools.sandbox`): it sees a read-only root with /usr and the
interpreter, an empty working directory (/tmp, a tmpfs of `disk_mb`), and nothing of the data, the run
directory, the home or other users' files; it runs as uid 65534 without capabilities, in PID, network, IPC,
UTS and user namespaces of its own, so it cannot reach the network or the host's Unix sockets (unless
`network="allowed"`), see or signal any other process, nor leave one running after the call. Kernel limits
are set inside, before the code starts: CPU seconds, address space (memory), size of any file written,
number of processes (per call: a fork bomb stops at its own limit), open files. A wall-clock timeout kills
the sandbox, and with it every process in it.

Output (stdout then stderr) is read while the code runs and truncated to `max_output` characters: what is
past that is counted and dropped, and a call that prints more than `FLOOD_BYTES` is killed, so printing
without end never grows the caller's memory.

Where a wall cannot be put up (no bubblewrap, no user namespaces), `run_python` refuses with a
`SandboxUnavailableError` that says which and how to fix it: a sandbox never silently loses a wall. The limits
are per call; the tool holds no state between calls (an agent that needs variables carries them in its code).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Literal

from ascent.envs.tools.sandbox import (
    WORKDIR,
    SandboxUnavailableError,
    check_sandbox,
    interpreter,
    sandbox_command,
    seccomp_pipe,
)

__all__ = ["FLOOD_BYTES", "Limits", "SandboxUnavailableError", "ToolResult", "run_python"]

FLOOD_BYTES = 8 << 20  # output read (and counted) past max_output before the call is killed
ENV = {"PATH": "/usr/bin:/bin", "HOME": WORKDIR, "TMPDIR": WORKDIR, "PYTHONIOENCODING": "utf-8"}


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returns to the model: `ok` is False when the code failed, timed out or was killed;
    `output` is what it printed (truncated), followed by the error when there was one."""

    ok: bool
    output: str
    error: str | None = None

    def text(self) -> str:
        """The observation the model reads."""
        return self.output if self.error is None else f"{self.output}\n[error] {self.error}".lstrip()


@dataclass(frozen=True)
class Limits:
    """Per call: wall clock, CPU seconds, address space, size of one file, processes (the call's own, not
    the machine user's), open files, characters of output kept, and the size of each of /tmp (the working
    directory) and /dev/shm."""

    timeout_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 8
    max_procs: int = 16
    max_files: int = 64
    max_output: int = 4000
    disk_mb: int = 32


def run_python(
    code: str, limits: Limits = Limits(), network: Literal["isolated", "allowed"] = "isolated"
) -> ToolResult:
    """Run `code` under `limits` in the sandbox (see the module docstring) -> ToolResult."""
    isolated = network == "isolated"
    check_sandbox(isolated)
    argv = [*_rlimits(limits), "--", interpreter(), "-I", "-S", "-c", code]
    seccomp = seccomp_pipe()
    try:
        cmd = sandbox_command(argv, disk_bytes=limits.disk_mb << 20, isolated=isolated, seccomp_fd=seccomp)
        pipe = subprocess.PIPE
        proc = subprocess.Popen(
            cmd,
            env=ENV,
            stdin=subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            start_new_session=True,
            pass_fds=(seccomp,),
        )
    finally:
        os.close(seccomp)
    with proc:  # closes the pipes and waits
        try:
            out, err, error = _collect(proc, limits)
        finally:
            _kill(proc)  # the sandbox's first process: the kernel ends every other one with it
    if error is None and proc.returncode != 0:
        error = _exit_reason(proc.returncode)
    return _result(out, err, limits, error)


def _rlimits(limits: Limits) -> list[str]:
    """util-linux's prlimit, run inside the sandbox's user namespace (where RLIMIT_NPROC counts the call's
    own processes only), then exec'ing the interpreter; SIGXCPU at the CPU limit, SIGKILL a second later."""
    mb = 1 << 20
    cpu = f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}"
    sizes = [f"--as={limits.memory_mb * mb}", f"--fsize={limits.file_mb * mb}", "--core=0"]
    counts = [f"--nofile={limits.max_files}", f"--nproc={limits.max_procs}"]
    return ["prlimit", cpu, *sizes, *counts]


class _Kept:
    """One output stream, decoded as it arrives: the first `keep` characters, and a count of the rest."""

    def __init__(self, keep: int) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.keep = keep
        self.parts: list[str] = []
        self.kept = self.dropped = 0  # characters

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self.decoder.decode(data, final)
        room = max(self.keep - self.kept, 0)
        if room:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        self.dropped += max(len(text) - room, 0)

    def text(self) -> str:
        return "".join(self.parts)


def _collect(proc: subprocess.Popen[bytes], limits: Limits) -> tuple[_Kept, _Kept, str | None]:
    """Read stdout and stderr until both close, keeping at most `max_output` characters of each; kill the
    sandbox at the wall clock or once it printed FLOOD_BYTES -> (stdout, stderr, error or None)."""
    assert proc.stdout is not None and proc.stderr is not None
    streams = {proc.stdout.fileno(): _Kept(limits.max_output), proc.stderr.fileno(): _Kept(limits.max_output)}
    deadline, total, error = time.monotonic() + limits.timeout_s, 0, None
    with selectors.DefaultSelector() as selector:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if error is None and left <= 0:
                error = f"timed out after {limits.timeout_s:g} s (killed)"
                _kill(proc)
            ready = selector.select(timeout=max(left, 0) if error is None else 5.0)
            if not ready and error is not None:
                break  # killed, and still no end of file: leave the pipes (their writers are gone)
            for key, _ in ready:
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fd)
                total += len(data)
                streams[key.fd].feed(data, final=not data)
            if error is None and total > FLOOD_BYTES:
                error = f"printed more than {FLOOD_BYTES >> 20} MiB (killed)"
                _kill(proc)
    out, err = streams.values()
    return out, err, error


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _exit_reason(code: int) -> str:
    """bwrap exits with the code's status, or 128 + the signal that killed it (negative: we killed bwrap)."""
    number = -code if code < 0 else code - 128
    if number in {s.value for s in signal.Signals}:
        name = signal.Signals(number).name
        hint = " (CPU time limit)" if name == "SIGXCPU" else " (file size limit)" if name == "SIGXFSZ" else ""
        return f"killed by {name}{hint}"
    return f"exited with status {code}"


def _result(out: _Kept, err: _Kept, limits: Limits, error: str | None) -> ToolResult:
    text = (out.text() + err.text())[: limits.max_output]
    more = out.kept + out.dropped + err.kept + err.dropped - len(text)
    if more:
        text += f"\n... [truncated: {more} more characters]"
    return ToolResult(ok=error is None, output=text, error=error)
