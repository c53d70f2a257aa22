"""The Python tool: the happy path, limits that stop the code while the caller goes on (infinite loop, memory
hog, fork bomb, huge output, a file too large, a hang past the wall clock), output bounded while it is read,
many calls at once, and the refusal where the sandbox cannot be built. The escape corpus (files, network,
processes, privileges) is test_sandbox_escapes.py."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ascent.envs.tools import Limits, SandboxUnavailableError, ToolResult, run_python, sandbox
from ascent.envs.tools.python import FLOOD_BYTES

FAST = Limits(timeout_s=10, cpu_s=2)


def run(code: str, limits: Limits = FAST) -> ToolResult:
    return run_python(code, limits)


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


def test_output_is_bounded_while_it_is_read() -> None:
    """Printing 50 MiB: the caller keeps max_output characters, reads on up to FLOOD_BYTES, then kills the
    call; its own memory does not grow with what was printed (the old tool grew by ~3x the output)."""
    before = _rss_mib()
    r = run("print('x' * (50 << 20))", Limits(max_output=1000))
    grown = _rss_mib() - before
    assert not r.ok and r.error == f"printed more than {FLOOD_BYTES >> 20} MiB (killed)"
    assert r.output.startswith("x" * 1000) and "[truncated: " in r.output and len(r.output) < 1100
    assert grown < 16, f"the caller grew by {grown:.0f} MiB reading a flood of output"


def _rss_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def test_sixty_four_calls_at_once_all_run_beside_a_fork_bomb() -> None:
    """RLIMIT_NPROC binds per call (each has a user namespace of its own), not per machine user: a fork bomb
    stops at its own limit while 64 other calls run at the same time."""
    codes = ["import os\nwhile True: os.fork()"] + ["print(1)"] * 64
    with ThreadPoolExecutor(len(codes)) as pool:
        bomb, *others = pool.map(run, codes)
    assert "Resource temporarily unavailable" in bomb.text()
    assert [(r.ok, r.output) for r in others] == [(True, "1\n")] * 64


def test_network_allowed_shares_the_network_but_still_hides_the_files(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("hidden")
    code = f"import os, socket; print(len(socket.if_nameindex()) > 1, os.path.exists({str(tmp_path)!r}))"
    assert run_python(code, FAST, network="allowed").output == "True False\n"
    assert run_python(code, FAST).output == "False False\n"  # isolated: loopback only


def test_a_missing_wall_is_refused_with_its_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox.check_sandbox.cache_clear()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError, match="install_bubblewrap.sh"):
        run_python("print(1)")
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "prlimit" else "/usr/bin/" + name)
    sandbox.check_sandbox.cache_clear()
    with pytest.raises(SandboxUnavailableError, match="util-linux's prlimit"):
        run_python("print(1)")
    monkeypatch.undo()
    sandbox.check_sandbox.cache_clear()
    monkeypatch.setattr(sandbox, "sandbox_command", lambda argv, **_: ["bwrap", "--unshare-user", "--bogus"])
    with pytest.raises(SandboxUnavailableError, match="user namespaces"):
        run_python("print(1)")
    sandbox.check_sandbox.cache_clear()
