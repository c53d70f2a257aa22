"""`ascent serve` through the real CLI: it serves a tiny model to the official openai client on a free port
(from its own process, and from two front-end processes), records every sample with `--record DIR` in the
experience store that `ascent episodes DIR` lists, and stops on SIGTERM (exit 143), leaving no front end
behind; serving without a key anywhere but localhost, or with a bad --api-processes, is refused with
exit 2."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from ascent.tracking.experience_store import open_store
from tests.integration.conftest import ascent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"ascent serve exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                return json.loads(resp.read())
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"ascent serve did not answer {url}/health within {timeout_s} s")


def front_end_pids(pid: int) -> list[int]:
    """The processes `pid` started with multiprocessing's spawn (its front ends), read from /proc."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.parametrize("api_processes", ["1", "2"])
def test_serve_answers_the_openai_client_and_stops_on_sigterm(
    tiny_model: Path, api_processes: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ASCENT_API_KEY": "s3cret"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ascent",
            "serve",
            "--model",
            str(tiny_model),
            "--port",
            str(port),
            "--max-tokens",
            "6",
            "--served-model-name",
            "tiny",
            "--log-level",
            "warning",
            "--device",
            "cpu",
            "--api-processes",
            api_processes,
            "--record",
            str(tmp_path / "served"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert wait_healthy(proc, f"http://127.0.0.1:{port}")["policy_version"] == 0
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="s3cret", max_retries=0, timeout=60)
        out = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "1+1="}], n=2)
        assert len(out.choices) == 2 and all(ch.finish_reason in ("stop", "length") for ch in out.choices)
        assert out.usage.completion_tokens <= 12
        chunks = list(c.completions.create(model="tiny", prompt="2+2=", stream=True))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        try:
            openai.OpenAI(base_url=c.base_url, api_key="wrong", max_retries=0).models.list()
            raise AssertionError("a wrong key was accepted")
        except openai.AuthenticationError:
            pass
        front_ends = front_end_pids(proc.pid)
        assert len(front_ends) == (0 if api_processes == "1" else 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr
    assert f"at http://127.0.0.1:{port}/v1" in stdout and "stopped by SIGTERM" in stderr
    assert all(not Path(f"/proc/{pid}").exists() for pid in front_ends)  # stopped with it
    with open_store(tmp_path / "served") as store:  # the chat call's 2 samples and the streamed completion
        served = store.episodes()
    assert [e.status for e in served] == ["served"] * 3 and {e.metadata["endpoint"] for e in served} == {
        "chat",
        "completions",
    }
    assert served[0].row_id == served[1].row_id != served[2].row_id  # the chat call's n=2 share a prompt
    assert all(e.response_len == len(e.sampler_logprobs) > 0 for e in served)
    if api_processes == "1":  # the CLI reads it too
        listing = ascent("episodes", str(tmp_path / "served"), "--status", "served").stdout
        assert "3 of 3 episodes" in listing and "served" in listing


def test_serve_refuses_keyless_serving_off_localhost(tiny_model: Path) -> None:
    env_key = os.environ.pop("ASCENT_API_KEY", None)
    try:
        proc = ascent("serve", "--model", str(tiny_model), "--host", "0.0.0.0", "--no-api-key", check=False)
        assert proc.returncode == 2 and "loopback" in proc.stderr and "Traceback" not in proc.stderr
        proc = ascent("serve", "--model", str(tiny_model), check=False)
        assert proc.returncode == 2 and "--api-key is not set" in proc.stderr
        proc = ascent(
            "serve", "--model", str(tiny_model), "--no-api-key", "--api-processes", "0", check=False
        )
        assert proc.returncode == 2 and "--api-processes 0" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        if env_key is not None:
            os.environ["ASCENT_API_KEY"] = env_key
