"""`ascent.cluster.mps` without a GPU: the overlap rule, a node's own daemon, and `start_mps` driving a fake
`nvidia-cuda-mps-control` (a script that records each call's argv, stdin and environment) through its start,
probe, stop and every failure path, none of which leaves a directory or a daemon behind."""

from __future__ import annotations

import json
import sys
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from ascent.cluster import mps
from ascent.cluster.mps import MpsUnavailable, node_daemon, overlaps_on_gpu, start_mps

OVERLAP = {
    "backend": "ray",
    "placement": "colocated",
    "engine_sleeps": False,
    "max_staleness": 1,
    "gpus_per_worker": 0.5,
    "device": "cuda",
}


# ------------------------------------------------------------------------------------------ the overlap rule
def test_only_ray_colocated_awake_and_running_ahead_on_gpus_overlaps():
    assert overlaps_on_gpu(**OVERLAP)
    assert overlaps_on_gpu(**{**OVERLAP, "max_staleness": 4, "device": "auto"})
    for field, value in [
        ("backend", "inline"),
        ("placement", "split"),
        ("engine_sleeps", True),
        ("max_staleness", 0),
        ("gpus_per_worker", 0.0),
        ("device", "cpu"),
    ]:
        assert not overlaps_on_gpu(**{**OVERLAP, field: value}), field


# ------------------------------------------------------------------------------------- a node's own daemon
def test_a_given_pipe_directory_is_the_nodes_daemon(monkeypatch, tmp_path):
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", str(tmp_path))
    assert node_daemon({"CUDA_MPS_PIPE_DIRECTORY": "/run/mps"}) == "/run/mps"
    assert node_daemon({"CUDA_MPS_PIPE_DIRECTORY": ""}) is None  # empty: unset


def test_the_default_directory_counts_only_with_its_control_pipe(monkeypatch, tmp_path):
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", str(tmp_path))
    assert node_daemon({}) is None
    (tmp_path / "control").touch()
    assert node_daemon({}) == str(tmp_path)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/from/os/environ")  # environ=None reads os.environ
    assert node_daemon() == "/from/os/environ"


# ------------------------------------------------------------------------------------ a fake control daemon
def fake_control(
    tmp_path: Path,
    d_exit: int = 0,
    d_stderr: str = "",
    servers: str = "4242",
    d_sleep: float = 0,
    makes_pipe: bool = True,
) -> Path:
    """An executable standing in for nvidia-cuda-mps-control: appends {argv, stdin, env} per call to
    calls.jsonl; `-d` makes the control pipe (a plain file; not with `makes_pipe=False` or a failing exit),
    sleeps `d_sleep` s, then exits `d_exit` (printing `d_stderr`); `get_server_list` answers `servers`."""
    script = tmp_path / "nvidia-cuda-mps-control"
    script.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(
            f"""
            import json, os, sys, time
            args = sys.argv[1:]
            stdin = "" if args else sys.stdin.read()  # `-d` gets no input: never read the terminal
            with open({str(tmp_path / "calls.jsonl")!r}, "a") as f:
                f.write(json.dumps({{"argv": args, "stdin": stdin, "env": dict(os.environ)}}) + "\\n")
            if args == ["-d"]:
                if {makes_pipe and d_exit == 0!r}:
                    open(os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control"), "w").close()
                time.sleep({d_sleep})
                sys.stderr.write({d_stderr!r})
                sys.exit({d_exit})
            if stdin.strip() == "get_server_list":
                print({servers!r})
            """
        )
    )
    script.chmod(0o755)
    return script


def calls(tmp_path: Path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def roots(monkeypatch, tmp_path) -> list[Path]:
    """The root directories start_mps makes (under tmp_path/roots, so a failing test leaves nothing in /tmp)."""
    made: list[Path] = []
    (tmp_path / "roots").mkdir()

    def mkdtemp(prefix: str, dir: str) -> str:
        assert dir == "/tmp"  # short: the pipe directory holds sockets
        made.append(Path(tempfile.mkdtemp(prefix=prefix, dir=tmp_path / "roots")))
        return str(made[-1])

    monkeypatch.setattr(mps, "tempfile", SimpleNamespace(mkdtemp=mkdtemp))
    return made


@pytest.fixture
def no_atexit(monkeypatch) -> list:
    """The stops start_mps registers for exit, kept out of the real atexit (the test stops the daemon)."""
    registered: list = []
    monkeypatch.setattr(mps.atexit, "register", registered.append)
    return registered


def test_start_runs_the_daemon_privately_probes_it_and_stop_quits_once(
    monkeypatch, tmp_path, roots, no_atexit
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    probed: list[dict[str, str]] = []
    daemon = start_mps(control=str(fake_control(tmp_path)), probe=probed.append)

    (root,) = roots
    assert daemon.root == str(root) and Path(daemon.pipe_dir).is_dir() and Path(daemon.log_dir).is_dir()
    assert daemon.env() == {
        "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
    }
    assert probed == [daemon.env()]
    start, ask = calls(tmp_path)
    assert start["argv"] == ["-d"]
    assert start["env"]["CUDA_MPS_PIPE_DIRECTORY"] == daemon.pipe_dir
    assert start["env"]["CUDA_MPS_LOG_DIRECTORY"] == daemon.log_dir
    assert "CUDA_VISIBLE_DEVICES" not in start["env"]  # the daemon sees every GPU of the node
    assert (ask["argv"], ask["stdin"]) == ([], "get_server_list\n")
    assert ask["env"]["CUDA_MPS_PIPE_DIRECTORY"] == daemon.pipe_dir
    assert no_atexit == [daemon.stop]  # stopped at exit should shutdown never come

    daemon.stop()
    quit_call = calls(tmp_path)[-1]
    assert (quit_call["stdin"], quit_call["env"]["CUDA_MPS_PIPE_DIRECTORY"]) == ("quit\n", daemon.pipe_dir)
    assert not root.exists() and daemon.stopped
    daemon.stop()
    assert len(calls(tmp_path)) == 3  # idempotent: no second quit


def test_stop_survives_a_control_that_cannot_run(tmp_path, roots, no_atexit, caplog):
    daemon = start_mps(control=str(fake_control(tmp_path)), probe=lambda env: None)
    Path(daemon.control).unlink()  # quit cannot be sent: warned, the directories still go
    daemon.stop()
    assert not roots[0].exists() and "did not quit cleanly" in caplog.text


def test_a_missing_executable_starts_nothing(tmp_path, roots):
    with pytest.raises(MpsUnavailable, match="nvidia-cuda-mps-control-absent is not on PATH"):
        start_mps(control="nvidia-cuda-mps-control-absent", probe=lambda env: None)
    assert roots == []


def test_a_daemon_that_does_not_start_leaves_nothing_and_says_why(tmp_path, roots, no_atexit):
    control = fake_control(tmp_path, d_exit=3, d_stderr="An instance of this daemon is already running")
    with pytest.raises(MpsUnavailable, match=r"-d failed: An instance of this daemon is already running"):
        start_mps(control=str(control), probe=lambda env: pytest.fail("probed without a daemon"))
    assert [c["argv"] for c in calls(tmp_path)] == [["-d"]]  # nothing to quit
    assert not roots[0].exists() and no_atexit == []
    with pytest.raises(MpsUnavailable, match=r"-d failed: exit 5"):  # silent: the exit status
        start_mps(control=str(fake_control(tmp_path, d_exit=5)), probe=lambda env: None)
    assert not roots[1].exists()


def failing_probe(env: dict[str, str]) -> None:
    raise MpsUnavailable("a CUDA client failed under MPS (exit 1): boom")


def test_a_failing_probe_quits_the_daemon_and_leaves_nothing(tmp_path, roots, no_atexit):
    with pytest.raises(MpsUnavailable, match="boom"):
        start_mps(control=str(fake_control(tmp_path)), probe=failing_probe)
    assert [(c["argv"], c["stdin"]) for c in calls(tmp_path)] == [(["-d"], ""), ([], "quit\n")]
    assert not roots[0].exists() and no_atexit[0].__self__.stopped


def test_no_server_for_the_probe_quits_the_daemon_and_leaves_nothing(tmp_path, roots, no_atexit):
    with pytest.raises(MpsUnavailable, match="no MPS server started"):
        start_mps(control=str(fake_control(tmp_path, servers="")), probe=lambda env: None)
    assert [c["stdin"] for c in calls(tmp_path)] == ["", "get_server_list\n", "quit\n"]
    assert not roots[0].exists()


def test_a_control_that_does_not_execute_leaves_nothing(tmp_path, roots, no_atexit):
    """Found on PATH, but exec fails (here a broken interpreter line): MpsUnavailable, not an OSError that
    `auto` would not catch, and the directories gone."""
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text("#!/nonexistent/interpreter\n")
    control.chmod(0o755)
    with pytest.raises(MpsUnavailable, match="-d could not run"):
        start_mps(control=str(control), probe=lambda env: pytest.fail("probed without a daemon"))
    assert not roots[0].exists() and no_atexit == []


def test_a_daemon_start_that_hangs_is_quit_and_leaves_nothing(tmp_path, roots, no_atexit):
    control = fake_control(tmp_path, d_sleep=60)
    with pytest.raises(MpsUnavailable, match=r"-d did not return within 0.5 s"):
        start_mps(
            control=str(control), probe=lambda env: pytest.fail("probed without a daemon"), timeout_s=0.5
        )
    assert [c["stdin"] for c in calls(tmp_path)] == ["", "quit\n"]  # it may have started after all
    assert not roots[0].exists()


def test_a_start_interrupted_before_the_daemon_came_up_stops_at_once(tmp_path, roots, no_atexit):
    """No control pipe: `quit` would block for its whole timeout, so stop sends none and returns."""
    control = fake_control(tmp_path, d_sleep=60, makes_pipe=False)
    with pytest.raises(MpsUnavailable, match=r"-d did not return within 0.5 s"):
        start_mps(
            control=str(control), probe=lambda env: pytest.fail("probed without a daemon"), timeout_s=0.5
        )
    assert [c["argv"] for c in calls(tmp_path)] == [["-d"]]  # no quit
    assert not roots[0].exists()


def test_a_control_that_stops_answering_is_unavailable_and_leaves_nothing(tmp_path, roots, no_atexit):
    control = fake_control(tmp_path)
    with pytest.raises(MpsUnavailable, match="did not answer get_server_list"):
        start_mps(control=str(control), probe=lambda env: control.unlink())
    assert not roots[0].exists()


def test_the_real_probe_fails_where_no_gpu_is_visible():
    """One real subprocess, given `env`: torch without CUDA (this machine), or with no visible GPU (a GPU
    machine), cannot make a CUDA tensor, and the client's last line of error is the reason."""
    with pytest.raises(MpsUnavailable) as err:
        mps.probe_client({"CUDA_VISIBLE_DEVICES": ""})  # no GPU for it, even on a GPU machine
    text = str(err.value)
    assert text.startswith("a CUDA client failed under MPS (exit 1): ")
    assert "CUDA" in text.split(": ", 1)[1] and text.split(": ", 1)[1] != "no output"
