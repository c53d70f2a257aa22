"""The Python tool's sandbox: the happy path, and each escape attempt contained while the caller goes on
(infinite loop, memory hog, fork bomb, huge output, a file too large, network, writing outside the working
directory, a hang past the wall clock)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from ascent.envs.tools import Limits, SandboxUnavailableError, ToolResult, run_python
from ascent.envs.tools.python import _netns_prefix

FAST = Limits(timeout_s=10, cpu_s=2)
ISOLATED = _netns_prefix() is not None  # this machine can make a network namespace
NETWORK = "isolated" if ISOLATED else "allowed"


def run(code: str, limits: Limits = FAST) -> ToolResult:
    return run_python(code, limits, network=NETWORK)


def test_code_runs_in_a_fresh_directory_and_returns_what_it_printed() -> None:
    r = run("import os; open('a.txt', 'w').write('hi'); print(open('a.txt').read(), sorted(os.listdir('.')))")
    assert r.ok and r.output == "hi ['a.txt']\n" and r.error is None
    again = run("import os; print(os.listdir('.'))")
    assert again.output == "[]\n"  # nothing carried over between calls


def test_an_exception_is_an_observation_not_a_crash() -> None:
    r = run("raise ValueError('boom')")
    assert not r.ok and "ValueError: boom" in r.output and r.error == "exited with status 1"
    assert "ValueError: boom" in r.text()


@pytest.mark.parametrize(
    ("code", "expect"),
    [
        ("while True: pass", "CPU time limit"),
        ("x = bytearray(4 * 1024**3)", "MemoryError"),
        ("open('big', 'wb').write(b'0' * (64 * 1024**2))", "File too large"),
        ("import os\nwhile True: os.fork()", "Resource temporarily unavailable"),
    ],
    ids=["infinite-loop", "memory-hog", "file-too-large", "fork-bomb"],
)
def test_limits_stop_the_code(code: str, expect: str) -> None:
    r = run(code)
    assert not r.ok and expect in r.text()


def test_a_hang_is_killed_at_the_wall_clock() -> None:
    r = run("import time; print('started', flush=True); time.sleep(60)", Limits(timeout_s=1.5))
    assert not r.ok and r.error == "timed out after 1.5 s (killed)" and r.output == "started\n"


def test_huge_output_is_truncated() -> None:
    r = run("print('x' * 100000)", Limits(max_output=1000))
    assert r.ok and len(r.output) < 1100 and "truncated: 99001 more characters" in r.output


def test_no_network() -> None:
    if not ISOLATED:
        with pytest.raises(SandboxUnavailableError, match="cannot cut the network"):
            run_python("print(1)")
        return
    r = run("import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)")
    assert not r.ok and "Network is unreachable" in r.output


def test_the_code_never_runs_as_root(tmp_path: Path) -> None:
    """As root the code runs as `nobody`, so it cannot write into folders it does not own (as any other user
    it runs as that user)."""
    r = run("import os; print(os.geteuid())")
    assert r.ok and int(r.output) == (pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else os.geteuid())
    if os.geteuid() == 0:
        target = tmp_path / "owned_by_root.txt"
        r = run(f"open({str(target)!r}, 'w').write('x')")
        assert not r.ok and "Permission denied" in r.output and not target.exists()
