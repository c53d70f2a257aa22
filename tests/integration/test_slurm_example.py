"""`examples/slurm/ascent_ray.sbatch` as far as a machine without Slurm allows: the script itself runs under
bash with stand-ins for `scontrol`, `srun`, `ray` and the controller's `python` on PATH (each logs its
arguments; `srun` runs its command here, as on the named node). Checked: the Ray head starts on the first
node with the allocation's CPUs and GPUs (`h100:8` -> 8) and the job's temp dir, every other node joins the
head's address, the controller gets `cluster.address` and the user's overrides, and the SIGTERM that
`--signal=B:TERM@120` sends to the batch script alone reaches the controller and not Ray's steps, the job
ending with the controller's status. The real multi-node Ray path is `test_multinode_ray.py`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "slurm" / "ascent_ray.sbatch"

STUBS = {
    "scontrol": 'printf "nodeA\\nnodeB\\nnodeC\\n"\n',
    "srun": """host=none
while [ $# -gt 0 ]; do
  case "$1" in
    -w) host=$2; shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
echo "$host $*" >> "$LOGS/srun.log"
case "$1" in
  hostname) echo "10.0.0.${host#node}" ;;
  *) exec "$@" ;;
esac
""",
    "ip": 'echo "2: $5    inet 10.9.9.9/24 brd 10.9.9.255 scope global $5"\n',
    "ray": """echo "$*" >> "$LOGS/ray.log"
trap 'echo "TERM $*" >> "$LOGS/ray_signals.log"; exit 143' TERM
sleep 300 & wait $!
""",
    "python": """echo "$*" >> "$LOGS/controller.log"
[ "$CONTROLLER" = finish ] && exit 0
trap 'echo TERM >> "$LOGS/controller_signals.log"; exit 143' TERM
touch "$LOGS/controller_started"
sleep 300 & wait $!
""",
}


def _stubs(tmp_path: Path) -> dict[str, str]:
    bin_dir, logs = tmp_path / "bin", tmp_path / "logs"
    bin_dir.mkdir()
    logs.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOGS": str(logs),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[A-C]",
        "SLURM_CPUS_PER_TASK": "64",
        "SLURM_GPUS_PER_NODE": "h100:8",
        "RAY_START_WAIT_S": "0.3",
    }


def _lines(path: Path, count: int, timeout: float = 20.0) -> list[str]:
    """The file's lines once it has `count` of them (background steps log a little later)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"{path.name}: fewer than {count} lines after {timeout} s")


def _start(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(SCRIPT), *args], env=env, start_new_session=True)


def _stop_group(proc: subprocess.Popen) -> None:
    """Slurm ends the job's steps when the batch script exits; here the stand-in Ray steps are killed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def test_the_script_starts_ray_on_every_node_and_the_controller_on_the_head(tmp_path: Path) -> None:
    env = {**_stubs(tmp_path), "CONTROLLER": "finish"}
    proc = _start(env, "run.yaml", "cluster.num_trainer_workers=16")
    try:
        assert proc.wait(timeout=60) == 0
        logs = tmp_path / "logs"
        ray = _lines(logs / "ray.log", 3)
        srun = _lines(logs / "srun.log", 5)
    finally:
        _stop_group(proc)
    head = "start --head --node-ip-address=10.0.0.A --port=6379 --temp-dir=/tmp/ray_42"
    assert ray[0] == f"{head} --num-cpus=64 --num-gpus=8 --block"
    joins = sorted(line for line in ray[1:])
    assert (
        joins
        == ["start --address=10.0.0.A:6379 --temp-dir=/tmp/ray_42 --num-cpus=64 --num-gpus=8 --block"] * 2
    )
    ray_hosts = sorted(line.split()[0] for line in srun if " ray start" in line)
    assert ray_hosts == ["nodeA", "nodeB", "nodeC"]
    assert (logs / "controller.log").read_text().split() == [
        "-m",
        "ascent",
        "train",
        "run.yaml",
        "cluster.backend=ray",
        "cluster.address=10.0.0.A:6379",
        "cluster.num_trainer_workers=16",
    ]
    assert any(line.startswith("nodeA python -m ascent train") for line in srun)


def test_head_iface_picks_the_address_the_nodes_share(tmp_path: Path) -> None:
    env = {**_stubs(tmp_path), "CONTROLLER": "finish", "HEAD_IFACE": "ib0", "RAY_PORT": "7000"}
    proc = _start(env, "run.yaml")
    try:
        assert proc.wait(timeout=60) == 0
        controller = (tmp_path / "logs" / "controller.log").read_text()
    finally:
        _stop_group(proc)
    assert "cluster.address=10.9.9.9:7000" in controller


def test_sigterm_to_the_batch_script_reaches_the_controller_only(tmp_path: Path) -> None:
    env = {**_stubs(tmp_path), "CONTROLLER": "wait"}
    proc = _start(env, "run.yaml")
    logs = tmp_path / "logs"
    try:
        deadline = time.monotonic() + 30
        while not (logs / "controller_started").exists():
            assert time.monotonic() < deadline, "the controller did not start"
            assert proc.poll() is None, f"the script ended early: {proc.returncode}"
            time.sleep(0.05)
        _lines(logs / "ray.log", 3)
        proc.send_signal(signal.SIGTERM)  # `--signal=B:TERM`: the batch shell alone
        status = proc.wait(timeout=30)
        time.sleep(0.2)  # a stray TERM to Ray's steps would be logged by now
        ray_signals = (logs / "ray_signals.log").exists()
        controller_signals = _lines(logs / "controller_signals.log", 1)
    finally:
        _stop_group(proc)
    assert status == 143  # the controller's own exit (it checkpointed and stopped)
    assert controller_signals == ["TERM"]
    assert not ray_signals, "Ray's steps got the SIGTERM"
