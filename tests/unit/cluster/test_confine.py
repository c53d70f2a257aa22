"""What a host process puts around user code (`ascent.cluster.confine`): what a call prints is capped (the
rest counted, its tail logged) without a writer ever blocking, and an allocation past the memory limit costs
its call, naming the setting, while the host serves on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ascent.cluster.confine import HEAD, TAIL
from ascent.cluster.hosts import IsolationPolicy, ProcessHosts

ROOT = Path(__file__).resolve().parents[3]


def loud(mib: int) -> int:
    """Prints `mib` MiB to stdout (Python's, then a child process's, which writes to the same descriptor), a
    line to stderr, and a last line that says it is the end."""
    sys.stdout.write("y" * (mib << 19))
    sys.stdout.flush()
    subprocess.run(["head", "-c", str(mib << 19), "/dev/zero"], check=True)
    print(f"loud {mib} ends here", flush=True)
    print(f"loud {mib} on stderr", file=sys.stderr, flush=True)
    return mib


def allocate(mib: int) -> int:
    return len(bytearray(mib << 20)) >> 20


# A controller whose reward prints 32 MiB in one call and a few bytes in the next: prints the answers and
# the lengths of what reached its stdout; the hosts' log lines go to its stderr.
LOUD_CONTROLLER = """
import logging, sys
from ascent.cluster.hosts import IsolationPolicy, ProcessHosts
from tests.unit.cluster.test_confine import loud
logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="LOG %(message)s")
hosts = ProcessHosts(1, IsolationPolicy("reward", 60.0, "reward.timeout_s"))
answers = [o.value for o in hosts.each(loud, [32, 0])]
hosts.close()
print("ANSWERS", answers, file=sys.stderr)
"""


def test_a_call_that_prints_without_end_is_capped_and_logged_with_its_tail() -> None:
    # before: a reward's prints went whole to the controller's stdout: gigabytes filled its console, its
    # Slurm log or whatever captured it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", LOUD_CONTROLLER], cwd=ROOT, env=env, capture_output=True, timeout=120
    )
    out, err = done.stdout, done.stderr.decode()
    assert done.returncode == 0 and "ANSWERS [32, 0]" in err, err[-2000:]  # no call blocked on its pipe
    assert len(out) <= HEAD + 100 and out.startswith(b"y" * 1000)  # the first call's first 64 KiB
    assert out.endswith(b"loud 0 ends here\n")  # the next call prints afresh, whole
    (line,) = [x for x in err.splitlines() if x.startswith("LOG ")]
    assert (
        line.startswith("LOG reward process ")
        and (
            ": one call printed 32.0 MiB to stdout, over the 64.0 KiB a call may print; 31.9 MiB of it "
            "dropped, of which the last 8.0 KiB follow:"
        )
        in line
    )
    tail = err.split(line, 1)[1]
    assert tail.startswith("\n" + "\0" * (TAIL - 18) + "loud 32 ends here\n")  # its last bytes, to the end
    assert "loud 32 on stderr" in err and "loud 0 on stderr" in err  # stderr's own cap is not reached


def test_an_allocation_past_the_memory_limit_costs_its_call_and_the_host_serves_on() -> None:
    # before: nothing limited a reward process's memory: 3 GiB here, all the machine has in general
    policy = IsolationPolicy(
        "reward", 60.0, "reward.timeout_s", memory_mb=1024, memory_field="reward.memory_limit_mb"
    )
    hosts = ProcessHosts(1, policy)
    try:
        chunk = hosts.map(allocate, [3072, 16])  # one command: each item its own outcome
        one = hosts.each(allocate, [3072, 16])  # one command each
    finally:
        hosts.close()
    for big, small in (chunk, one):
        assert big.error is not None and big.error.startswith("MemoryError")
        assert big.error.endswith("(over the 1024 MiB each reward process may use: reward.memory_limit_mb)")
        assert small.value == 16
