"""The run directory lock and checks, the stop flag of SIGTERM/SIGINT, and the pre-flight checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ascent.config import ConfigError
from ascent.models.loading import ModelLoadError
from ascent.orchestrator import preflight
from ascent.orchestrator.interrupt import SignalStop, graceful_stop, stopped_message
from ascent.orchestrator.rundir import RunDirError, RunDirLock, check_writable_dir, open_run_dir


def test_lock_refuses_a_second_holder_in_another_process_and_frees_on_exit(tmp_path):
    lock = RunDirLock(tmp_path).acquire()
    code = (
        "from pathlib import Path; from ascent.orchestrator.rundir import RunDirLock; "
        "RunDirLock(Path('{}')).acquire()"
    )
    other = subprocess.run([sys.executable, "-c", code.format(tmp_path)], capture_output=True, text=True)
    assert other.returncode != 0 and f"pid {os.getpid()}" in other.stderr
    lock.release()
    again = subprocess.run([sys.executable, "-c", code.format(tmp_path)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr  # freed by release, and the child's lock by its exit
    RunDirLock(tmp_path).acquire().release()


def test_open_run_dir_refuses_existing_checkpoints_without_resume(tmp_path):
    (tmp_path / "checkpoints" / "iter_000001").mkdir(parents=True)
    cfg = SimpleNamespace(run_dir=str(tmp_path), resume=False)
    with pytest.raises(RunDirError, match="already holds checkpoints"):
        open_run_dir(cfg)
    _, lock = open_run_dir(SimpleNamespace(run_dir=str(tmp_path), resume=True))
    lock.release()


def test_writable_dir_names_the_file_in_the_way(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        check_writable_dir(tmp_path / "f")
    with pytest.raises(RunDirError, match="lies under"):
        check_writable_dir(tmp_path / "f" / "deeper" / "run")


def test_open_run_dir_refuses_a_checkpoints_path_no_save_could_use(tmp_path, monkeypatch):
    ckpts = tmp_path / "checkpoints"
    cfg = SimpleNamespace(run_dir=str(tmp_path), resume=True)
    ckpts.symlink_to(tmp_path / "nowhere")
    with pytest.raises(RunDirError, match=r"checkpoints' is a broken link.*move or remove it"):
        open_run_dir(cfg)
    ckpts.unlink()
    ckpts.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: real(p, mode) and p != ckpts)  # root writes anything
    with pytest.raises(RunDirError, match=r"checkpoints' is not writable.*fix its permissions"):
        open_run_dir(cfg)
    monkeypatch.setattr(os, "access", real)
    _, lock = open_run_dir(cfg)  # an empty, writable checkpoints/ is fine
    lock.release()


def test_first_signal_waits_for_a_safe_point_second_stops_now():
    before = signal.getsignal(signal.SIGTERM)  # Ray, if a test started it, installs its own
    with graceful_stop() as stop:
        with pytest.raises(SignalStop):  # not armed: loading, nothing to save
            os.kill(os.getpid(), signal.SIGTERM)
        stop.arm()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM
        with pytest.raises(SignalStop) as err:
            os.kill(os.getpid(), signal.SIGINT)
        assert err.value.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGTERM) == before  # restored


def test_stopped_message_says_only_what_is_true():
    with_ckpt = stopped_message(signal.SIGTERM, "iteration", "/r/checkpoints/iter_000004", 4, 10)
    assert with_ckpt.exit_code == 143 and "iter_000004" in str(with_ckpt) and "--resume" in str(with_ckpt)
    without = stopped_message(signal.SIGINT, "step", None, 4, 10)
    assert without.exit_code == 130 and "no checkpoint was written" in str(without)


def test_preflight_vocab_context_and_stop_tokens():
    tok = [0] * 120  # len() is all check_vocab needs
    with pytest.raises(ModelLoadError, match="vocab_size=100"):
        preflight.check_vocab(tok, {"vocab_size": 100}, "m")
    assert preflight.check_vocab(tok, {"vocab_size": 128}, "m") == 128
    with pytest.raises(ConfigError, match=r"rollout\.stop_token_ids"):
        preflight.check_stop_tokens([5, 128], 128)
    preflight.check_context({"max_position_embeddings": 64}, 30, 34, 30)
    with pytest.raises(ConfigError, match="max_new_tokens to 34 or less"):
        preflight.check_context({"max_position_embeddings": 64}, 30, 35, 30)


def test_preflight_resolves_plugins_with_the_field_named():
    algo = SimpleNamespace(
        advantage="grpo",
        policy_loss="os:no_such",
        loss_aggregation="token-mean",
        kl_estimator="k3",
        kl_penalty_estimator="k1",
    )
    with pytest.raises(ConfigError, match=r"algorithm\.policy_loss='os:no_such'"):
        preflight.check_plugins(algo)
