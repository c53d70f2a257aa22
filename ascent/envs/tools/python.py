"""A Python tool for agents: run untrusted code in a separate, limited process and return what it printed.

Each call gets a fresh process (`python -I`, no site packages of the user, no environment variables but a
minimal PATH) in a fresh, empty working directory that is removed afterwards, with kernel limits set before
the code starts: CPU seconds, address space (memory), size of any file written, number of processes (so a
fork bomb stops), open files. A wall-clock timeout kills the whole process group. The network is cut by
running the process in a network namespace of its own (`unshare -n`, or `unshare -rn` without root), and when
ascent runs as root the code runs as `nobody`, so it cannot write outside its working directory into files
and folders it does not own. Output (stdout then stderr) is truncated to `max_output` characters.

Where the machine cannot make a network namespace, `run_python` refuses with a message that says so, unless
`network="allowed"` is passed: a sandbox never silently loses a wall. The limits are per call; the tool holds
no state between calls (an agent that needs variables carries them in its code).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from typing import Literal

from ascent.errors import AscentError

NOBODY = "nobody"


class SandboxUnavailableError(AscentError):
    """The sandbox cannot put up one of its walls on this machine (network namespace, unprivileged user)."""


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
    timeout_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 8
    max_procs: int = 16
    max_files: int = 64
    max_output: int = 4000


def run_python(
    code: str, limits: Limits = Limits(), network: Literal["isolated", "allowed"] = "isolated"
) -> ToolResult:
    """Run `code` under `limits` (see the module docstring) -> ToolResult."""
    prefix = _netns_prefix() if network == "isolated" else []
    if network == "isolated" and prefix is None:
        raise SandboxUnavailableError(
            "the Python tool cannot cut the network here: `unshare -n` (and `unshare -rn`) failed. Install "
            "util-linux or allow user namespaces, or pass network='allowed' to run without that wall."
        )
    user = _drop_to() if os.geteuid() == 0 else None
    if os.geteuid() == 0 and user is None:
        raise SandboxUnavailableError(
            "the Python tool runs as root here and cannot hand the code to `nobody` (it needs that user and "
            "`setpriv` from util-linux): as root the code could write anywhere and fork without limit. "
            "Install util-linux, or run ascent as an ordinary user."
        )
    work = tempfile.mkdtemp(prefix="ascent-tool-")
    try:
        drop: list[str] = []
        if user is not None:  # after unshare (which needs root), before python: setpriv (util-linux)
            os.chown(work, user.pw_uid, user.pw_gid)
            drop = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
        cmd = [*(prefix or []), *drop, sys.executable, "-I", "-c", code]
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "PYTHONIOENCODING": "utf-8"}
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=lambda: _limit(limits))  # fmt: skip
        try:
            out, err = proc.communicate(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return _result(out, err, limits, f"timed out after {limits.timeout_s:g} s (killed)")
        finally:
            _kill_group(proc)  # whatever the code left running in its group
        return _result(out, err, limits, None if proc.returncode == 0 else _exit_reason(proc.returncode))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _limit(limits: Limits) -> None:
    """In the child, before anything runs: kernel limits, inherited through unshare and setpriv (the process
    limit binds once setpriv has dropped root, which the kernel exempts from it)."""
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))  # SIGXCPU first, then KILL
    for what, value in ((resource.RLIMIT_AS, limits.memory_mb * mb), (resource.RLIMIT_FSIZE, limits.file_mb * mb),
                        (resource.RLIMIT_NOFILE, limits.max_files), (resource.RLIMIT_NPROC, limits.max_procs),
                        (resource.RLIMIT_CORE, 0)):  # fmt: skip
        resource.setrlimit(what, (value, value))


def _drop_to() -> pwd.struct_passwd | None:
    """The user root hands the code to; None when there is no `nobody` or no `setpriv` (run_python refuses)."""
    if shutil.which("setpriv") is None:
        return None
    try:
        return pwd.getpwnam(NOBODY)
    except KeyError:
        return None


@cache
def _netns_prefix() -> list[str] | None:
    """The command prefix that runs a process in a network namespace of its own, or None if none works."""
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        try:
            ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return prefix
    return None


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _exit_reason(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (CPU time limit)" if name == "SIGXCPU" else " (file size limit)" if name == "SIGXFSZ" else ""
        return f"killed by {name}{hint}"
    return f"exited with status {code}"


def _result(out: bytes, err: bytes, limits: Limits, error: str | None) -> ToolResult:
    text = (out + err).decode("utf-8", errors="replace")
    if len(text) > limits.max_output:
        text = (
            text[: limits.max_output] + f"\n... [truncated: {len(text) - limits.max_output} more characters]"
        )
    return ToolResult(ok=error is None, output=text, error=error)
