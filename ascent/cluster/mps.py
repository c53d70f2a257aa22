"""CUDA MPS for the worker processes that share a GPU and compute at the same time.

Without MPS, two processes on one GPU never run kernels at once: the GPU switches between their contexts in
time slices. A colocated trainer rank and an awake engine replica that generates during the update (Ray,
`cluster.engine_sleeps=false`, `rollout.max_staleness >= 1`) then take turns, and the update beside a decoding
replica ran 1.55-1.8x longer than alone (BENCHMARKS.md). Under MPS both are clients of one server, and the
update's matmuls and the decode step's memory-bound kernels share the multiprocessors.

`cluster.mps` (auto | on | off) decides whether a run starts a daemon of its own (`start_mps`): a private pipe
directory under /tmp, so no other process on the node becomes its client; the workers get that directory in
their environment before they touch CUDA (`MpsDaemon.env`); a probe client must connect before the run goes
on; the daemon is stopped at shutdown (and at exit, should shutdown never come). A daemon the node already
runs (`CUDA_MPS_PIPE_DIRECTORY` set, or one at the default /tmp/nvidia-mps) is used as it is.

The daemon sees every GPU of the node (its environment drops `CUDA_VISIBLE_DEVICES`): an MPS client's
`CUDA_VISIBLE_DEVICES` counts among the devices its server sees, and Ray gives each worker physical ids.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # where CUDA looks when CUDA_MPS_PIPE_DIRECTORY is unset
PROBE = "import torch; x = torch.ones(1, device='cuda'); x.add_(1); torch.cuda.synchronize()"


class MpsUnavailable(RuntimeError):
    """MPS could not be started here (the message says why)."""


def overlaps_on_gpu(
    backend: str, placement: str, engine_sleeps: bool, max_staleness: int, gpus_per_worker: float, device: str
) -> bool:
    """Whether a run's trainer ranks and engine replicas compute on the same GPUs at the same time: Ray,
    colocated, the engine awake through the update and allowed to run ahead (staleness >= 1), on GPUs."""
    on_gpus = gpus_per_worker > 0 and device != "cpu"
    return (
        backend == "ray" and placement == "colocated" and not engine_sleeps and max_staleness >= 1 and on_gpus
    )


def node_daemon(environ: dict[str, str] | None = None) -> str | None:
    """The pipe directory of an MPS daemon this node already runs for us, or None."""
    env = os.environ if environ is None else environ
    given = env.get("CUDA_MPS_PIPE_DIRECTORY")
    if given:
        return given
    return DEFAULT_PIPE_DIR if (Path(DEFAULT_PIPE_DIR) / "control").exists() else None


@dataclass
class MpsDaemon:
    """A running MPS control daemon of this run (see the module doc)."""

    control: str  # the nvidia-cuda-mps-control executable
    root: str  # holds the pipe and log directories; removed at stop
    stopped: bool = field(default=False, init=False)

    @property
    def pipe_dir(self) -> str:
        return str(Path(self.root) / "pipe")

    @property
    def log_dir(self) -> str:
        return str(Path(self.root) / "log")

    def env(self) -> dict[str, str]:
        """What a process needs in its environment, before it initialises CUDA, to be this daemon's client."""
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def command(self, text: str, timeout_s: float = 30.0) -> str:
        """One command to the control daemon (`get_server_list`, `quit`, ...) -> its answer."""
        out = subprocess.run(
            [self.control],
            input=text + "\n",
            env=_daemon_env(self.env()),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        return out.stdout.strip()

    def came_up(self, wait_s: float = 2.0) -> bool:
        """Whether the daemon made its control pipe (waiting up to `wait_s` for a late one). Without it
        `quit` would block for its whole timeout: an interrupted start-up never got that far."""
        pipe = Path(self.pipe_dir) / "control"
        deadline = time.monotonic() + wait_s
        while not pipe.exists():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        """Quit the daemon (after its clients are gone) and remove its directories; idempotent."""
        if self.stopped:
            return
        self.stopped = True
        try:
            if self.came_up():
                self.command("quit")
            else:
                log.info("MPS daemon under %s never came up: nothing to quit", self.root)
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("MPS daemon under %s did not quit cleanly: %s", self.root, e)
        shutil.rmtree(self.root, ignore_errors=True)


def _daemon_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**env, **extra}


def probe_client(env: dict[str, str], timeout_s: float = 120.0) -> None:
    """Run a CUDA client with `env` added; raise MpsUnavailable if it fails."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise MpsUnavailable(f"a CUDA client did not start under MPS within {timeout_s:g} s") from None
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise MpsUnavailable(f"a CUDA client failed under MPS (exit {out.returncode}): {tail[0]}")


def start_mps(
    control: str = CONTROL, probe: Callable[[dict[str, str]], None] = probe_client, timeout_s: float = 30.0
) -> MpsDaemon:
    """Start a private MPS control daemon and check that a client reaches its server (see the module doc).

    Raises MpsUnavailable (nothing left running) when the executable is missing or cannot run, the daemon does
    not start (or its control does not answer within `timeout_s`), or the probe client fails or runs without
    it."""
    exe = shutil.which(control)
    if exe is None:
        raise MpsUnavailable(f"{control} is not on PATH (it comes with the NVIDIA driver's utilities)")
    daemon = MpsDaemon(exe, tempfile.mkdtemp(prefix="ascent-mps-", dir="/tmp"))  # short: socket paths
    for d in (daemon.pipe_dir, daemon.log_dir):
        Path(d).mkdir()
    _run_daemon(daemon, control, timeout_s)
    atexit.register(daemon.stop)
    try:
        probe(daemon.env())
        try:
            servers = daemon.command("get_server_list", timeout_s)
        except (OSError, subprocess.SubprocessError) as e:
            raise MpsUnavailable(f"{control} did not answer get_server_list: {e}") from None
        if not servers:
            raise MpsUnavailable("the probe client ran, but no MPS server started for it")
    except BaseException:
        daemon.stop()
        raise
    log.info("MPS daemon started for this run (pipe directory %s)", daemon.pipe_dir)
    return daemon


def _run_daemon(daemon: MpsDaemon, control: str, timeout_s: float) -> None:
    """`control -d` for `daemon`; on failure raise MpsUnavailable, its directories removed (and, where it may
    have started after all, the daemon quit)."""
    try:
        started = subprocess.run(
            [daemon.control, "-d"],
            env=_daemon_env(daemon.env()),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except OSError as e:  # found on PATH, but it does not execute
        shutil.rmtree(daemon.root, ignore_errors=True)
        raise MpsUnavailable(f"{control} -d could not run: {e}") from None
    except subprocess.TimeoutExpired:
        daemon.stop()
        raise MpsUnavailable(f"{control} -d did not return within {timeout_s:g} s") from None
    if started.returncode != 0:
        shutil.rmtree(daemon.root, ignore_errors=True)
        why = (started.stderr or started.stdout).strip() or f"exit {started.returncode}"
        raise MpsUnavailable(f"{control} -d failed: {why}")
