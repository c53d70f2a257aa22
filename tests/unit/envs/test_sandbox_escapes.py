"""The Python tool's walls against a corpus of escapes, run as the test's user (root here) and again as an
ordinary user (uid 65534 through setpriv when the test is root): every escape prints WALL-HELD, none prints
ESCAPED or the secret, and the host shows no trace (no file written, no connection, no surviving process).

The corpus reads held-out data, /etc/passwd, the home and the run directory; writes outside its working
directory; connects to a TCP port and to Unix sockets (a path and an abstract name) of the host; forks without
end; leaves a double-forked setsid daemon; kills its parent and every process it may signal while another call
runs; leaves files in /tmp and /dev/shm for the next call; looks for the caller's secrets in its environment;
and checks that it holds no capabilities, runs with NoNewPrivs as uid 65534, and cannot ptrace.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from ascent.envs.tools import run_python
from ascent.envs.tools.sandbox import SANDBOX_UID

HELD, SECRET = "WALL-HELD", "ascent-secret-" + uuid.uuid4().hex
DRIVER = Path(__file__).with_name("sandbox_driver.py")
PRELUDE = f"""import contextlib, ctypes, os, socket, sys, time
def attempt(what):
    try:
        got = what()
    except OSError:
        print({HELD!r})
    else:
        print("ESCAPED", repr(got)[:200])
"""


@dataclass(frozen=True)
class Host:
    """What the host holds within the code's reach if a wall fell: files with the secret, open sockets."""

    run: Path  # a run directory: data/val.jsonl holds the secret
    home: Path  # the caller's home: a file named `tag` holds the secret
    tag: str  # names the files the code tries to leave and its daemon's command line
    tcp: socket.socket
    unix: socket.socket
    abstract: socket.socket


def escapes(h: Host) -> dict[str, str]:
    """name -> code that prints HELD when the wall held (and ESCAPED with what it got when it did not)."""
    status = "dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())"
    privileges = (
        f"s = {{k: v.split() for k, v in {status}.items()}}\nprint({HELD!r} if "
        + " and ".join(
            [f"s['{c}'] == ['0000000000000000']" for c in ("CapBnd", "CapEff", "CapPrm", "CapAmb")]
            + ["s['NoNewPrivs'] == ['1']", f"s['Uid'] == ['{SANDBOX_UID}'] * 4"]
        )
        + " else ('ESCAPED', s))"
    )
    daemon = f"[sys.executable, '-c', 'import time; time.sleep(30)', {h.tag!r}]"
    cases = {
        "read-data": f"attempt(lambda: open({str(h.run / 'data' / 'val.jsonl')!r}).read())",
        "list-run-dir": f"attempt(lambda: os.listdir({str(h.run)!r}))",
        "read-passwd": "attempt(lambda: open('/etc/passwd').read())",
        "read-home": f"attempt(lambda: open({str(h.home / h.tag)!r}).read())",
        "write-home": f"attempt(lambda: open({str(h.home / (h.tag + '.bashrc'))!r}, 'w'))",
        "write-run-dir": f"attempt(lambda: open({str(h.run / h.tag)!r}, 'w'))",
        "write-root": "attempt(lambda: open('/pwned', 'w'))",
        "write-usr": "attempt(lambda: open('/usr/pwned', 'w'))",
        "write-interpreter": "attempt(lambda: open(sys.base_prefix + '/pwned', 'w'))",
        "tcp-loopback": (f"attempt(lambda: socket.create_connection({h.tcp.getsockname()!r}, timeout=2))"),
        "unix-socket": (f"attempt(lambda: socket.socket(socket.AF_UNIX).connect({h.unix.getsockname()!r}))"),
        "abstract-socket": (
            f"attempt(lambda: socket.socket(socket.AF_UNIX).connect({h.abstract.getsockname()!r}))"
        ),
        "fork-bomb": f"try:\n    while True: os.fork()\nexcept OSError:\n    print({HELD!r})",
        "daemon": "if os.fork() == 0:\n    os.setsid()\n"
        f"    os.fork() or os.execv(sys.executable, {daemon})\n"
        f"    os._exit(0)\nos.wait()\nprint({HELD!r})",
        "kill-everything": "with contextlib.suppress(OSError): os.kill(os.getppid(), 9)\n"
        f"with contextlib.suppress(OSError): os.kill(-1, 9)\nprint({HELD!r})",
        "see-processes": "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        f"print({HELD!r} if set(pids) == {{1, os.getpid()}} else ('ESCAPED', pids))",
        "witness": f"time.sleep(1.0)\nprint({HELD!r})",  # runs while kill-everything kills what it can
        "environment": (
            f"print({HELD!r} if 'ASCENT_TEST_SECRET' not in os.environ else ('ESCAPED', dict(os.environ)))"
        ),
        "privileges": privileges,
        "ptrace": (
            f"libc = ctypes.CDLL(None)\nprint({HELD!r} if libc.ptrace(16, 1, 0, 0) == -1 else 'ESCAPED')"
        ),
        "leave-files": "for d in ('/tmp', '/dev/shm'):\n"
        f"    open(os.path.join(d, {h.tag!r}), 'w').write('x')\n"
        f"print({HELD!r})",
    }
    return {name: PRELUDE + code for name, code in cases.items()}


FIND_LEFT_FILES = (
    PRELUDE + f"print({HELD!r} if os.listdir('/tmp') == os.listdir('/dev/shm') == [] else 'ESCAPED')"
)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    """World-readable run and home directories and open sockets (so that the ordinary user's variant would
    reach them too if a wall fell); the caller's environment holds a secret."""
    monkeypatch.setenv("ASCENT_TEST_SECRET", SECRET)
    base, tag = Path(tempfile.mkdtemp(prefix="ascent-escape-")), "escape-" + uuid.uuid4().hex
    (base / "run" / "data").mkdir(parents=True)
    (base / "run" / "data" / "val.jsonl").write_text(json.dumps({"answer": SECRET}) + "\n")
    (base / "home").mkdir()
    for home in (base / "home", Path.home()):
        (home / tag).write_text(SECRET)
    sockets = [socket.socket(), socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
    for s, address in zip(sockets, [("127.0.0.1", 0), str(base / "sock"), "\0" + tag], strict=True):
        s.bind(address)
        s.listen()
        s.setblocking(False)
    for path in [base, *base.rglob("*")]:
        path.chmod(0o777 if path.is_socket() else 0o755 if path.is_dir() else 0o644)
    try:
        yield Host(base / "run", Path.home(), tag, *sockets)
    finally:
        for s in sockets:
            s.close()
        (Path.home() / tag).unlink()
        subprocess.run(["rm", "-rf", str(base)], check=True)


def assert_held(results: dict[str, tuple[bool, str]], h: Host) -> None:
    """Every escape printed HELD and nothing of the secret; the host shows no trace of any."""
    failed = {name: text for name, (_, text) in results.items() if HELD not in text or "ESCAPED" in text}
    assert not failed, f"walls fell: {failed}"
    assert not [name for name, (_, text) in results.items() if SECRET in text]
    assert results["witness"] == (True, HELD + "\n")  # kill-everything could not reach it
    traces = [h.run / h.tag, h.home / (h.tag + ".bashrc"), Path("/tmp", h.tag), Path("/dev/shm", h.tag)]
    assert [p for p in traces if p.exists()] == []
    for s in (h.tcp, h.unix, h.abstract):
        with pytest.raises(BlockingIOError):
            s.accept()  # nobody connected
    survivors = [p for p in Path("/proc").iterdir() if p.name.isdigit() and h.tag.encode() in _cmdline(p)]
    assert survivors == [], "the daemon outlived its call"


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:  # ended meanwhile
        return b""


def test_escapes_fail_as_the_callers_user(host: Host) -> None:
    codes = escapes(host)
    with ThreadPoolExecutor(len(codes)) as pool:
        results = dict(zip(codes, pool.map(run_python, codes.values()), strict=True))
    assert_held({name: (r.ok, r.text()) for name, r in results.items()}, host)
    assert HELD in run_python(FIND_LEFT_FILES).output  # /tmp and /dev/shm died with their call


def test_escapes_fail_as_an_ordinary_user(host: Host) -> None:
    """The same corpus from a process of uid 65534 (the test's own user when it is not root): bwrap runs
    unprivileged, and kill(-1, SIGKILL) inside would end that process if the PID namespace fell."""
    ordinary = replace(host, home=host.run.parent / "home")
    results = run_as_ordinary_user(escapes(ordinary))
    assert_held(results, ordinary)
    assert HELD in run_as_ordinary_user({"find": FIND_LEFT_FILES})["find"][1]


def run_as_ordinary_user(codes: dict[str, str]) -> dict[str, tuple[bool, str]]:
    """Runs `codes` through sandbox_driver.py as uid 65534 (root) or as the test's user, with the secret in
    its environment; a bare system Python serves where the test's interpreter is private to root."""
    ids = [f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"]
    prefix = ["setpriv", *ids] if os.geteuid() == 0 else []
    env = {"PATH": "/usr/bin:/bin", "ASCENT_TEST_SECRET": SECRET}
    pythons = [p for p in (sys.executable, "/usr/bin/python3") if _runs([*prefix, p, "-c", READABLE])]
    assert pythons, f"no Python that uid {SANDBOX_UID} can run (tried {sys.executable}, /usr/bin/python3)"
    cmd, stdin = [*prefix, pythons[0], str(DRIVER)], json.dumps(list(codes.items()))
    done = subprocess.run(cmd, input=stdin, env=env, cwd="/", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the ordinary user's process did not survive: {done.stderr[-2000:]}"
    return {name: (ok, text) for name, (ok, text) in json.loads(done.stdout).items()}


READABLE = "import sys; open(sys.executable, 'rb').close()"  # the sandbox binds it: the user must read it


def _runs(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False
