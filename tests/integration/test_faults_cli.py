"""Faults a user meets, through the real CLI: each exits 2 with one message that names the field or file and
the fix, and no traceback (`--debug` adds it); nothing that was there before is lost."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest
from conftest import ascent_here, run_config, write_yaml

from ascent.tracking import read_status


def run_train(tmp_path, cfg, *extra, debug=False):
    args = ["--debug"] if debug else []
    proc = ascent_here(*args, "train", str(write_yaml(tmp_path / "r.yaml", cfg)), *extra, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def assert_clean_refusal(code, out, *needles):
    assert code == 2, out
    assert "Traceback" not in out, out
    for needle in needles:
        assert needle in out, f"{needle!r} not in:\n{out}"


# ---------------------------------------------------------------- config values refused before any loading

BAD_SETTINGS = {
    "grpo_greedy": ({"rollout.temperature": 0.0}, ["rollout.temperature=0", "advantages"]),
    "unknown_engine": ({"rollout.engine": "vllm"}, ["rollout.engine='vllm'", "reference"]),
    "advantage_import_path": (
        {"algorithm.advantage": "nosuchpkg.mod:adv"},
        ["algorithm.advantage", "nosuchpkg"],
    ),
    "policy_loss_attribute": (
        {"algorithm.policy_loss": "ascent.algorithms:no_such_loss"},
        ["algorithm.policy_loss", "no_such_loss"],
    ),
    "wandb_without_key": (
        {"tracking.wandb_project": "proj"},
        ["tracking.wandb_project='proj'", "wandb login", "tracking.wandb_mode=offline"],
    ),
    "mlflow_unreachable": (
        {"tracking.mlflow_uri": "http://127.0.0.1:9"},
        ["tracking.mlflow_uri='http://127.0.0.1:9' cannot be reached"],
    ),
    "stop_token_outside_vocab": (
        {"rollout.stop_token_ids": [10**6]},
        ["rollout.stop_token_ids", "vocabulary"],
    ),
    "context_too_long": (
        {"rollout.max_new_tokens": 600, "train.max_tokens_per_micro_batch": 1024},
        ["rollout.max_new_tokens=600", "max_position_embeddings=512"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_SETTINGS))
def test_bad_setting_is_refused_with_its_field(case, tmp_path, tiny_model, arithmetic_data, monkeypatch):
    settings, needles = BAD_SETTINGS[case]
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # no W&B key on this machine, whatever the developer's
    monkeypatch.setenv("NETRC", str(tmp_path / "no.netrc"))
    cfg = run_config(tmp_path, tiny_model, arithmetic_data)
    for key, value in settings.items():
        section, field = key.split(".")
        cfg.setdefault(section, {})[field] = value
    code, out = run_train(tmp_path, cfg)
    assert_clean_refusal(code, out, *needles)
    assert not (tmp_path / "run" / "checkpoints").exists()
    # refused before the run started (no status.json), or after: then status.json says crashed, and why
    status = read_status(tmp_path / "run")
    assert status is None or (status["state"] == "crashed" and needles[0] in status["error"]), status
    if case == "stop_token_outside_vocab":  # checked once the tokenizer is loaded, after the run started
        assert status is not None


def test_debug_flag_adds_the_traceback(tmp_path, tiny_model, arithmetic_data):
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, **{"rollout.engine": "vllm"})
    code, out = run_train(tmp_path, cfg, debug=True)
    assert code == 2 and "Traceback" in out and "rollout.engine" in out


# ---------------------------------------------------------------- broken files and directories


def test_empty_model_directory(tmp_path, arithmetic_data):
    (tmp_path / "empty").mkdir()
    code, out = run_train(tmp_path, run_config(tmp_path, tmp_path / "empty", arithmetic_data))
    assert_clean_refusal(code, out, "empty", "model.path")


def test_truncated_weights_file(tmp_path, tiny_model, arithmetic_data):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:2000])
    code, out = run_train(tmp_path, run_config(tmp_path, broken, arithmetic_data))
    assert_clean_refusal(code, out, "model.safetensors", "truncated")


def test_tokenizer_larger_than_the_model_vocabulary(tmp_path, tiny_model, arithmetic_data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.add_tokens([f"<extra_{i}>" for i in range(200)])
    tok.save_pretrained(str(tmp_path / "bigtok"))
    cfg = run_config(
        tmp_path, tiny_model, arithmetic_data, **{"model.tokenizer_path": str(tmp_path / "bigtok")}
    )
    code, out = run_train(tmp_path, cfg)
    assert_clean_refusal(code, out, "vocab_size", "tokenizer")


def test_data_file_not_utf8(tmp_path, tiny_model, arithmetic_data):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "3"}\n')
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, **{"data.train_path": str(bad)})
    code, out = run_train(tmp_path, cfg)
    assert_clean_refusal(code, out, "latin1.jsonl line 2", "UTF-8")


@pytest.mark.parametrize("where", ["is_file", "under_file"])
def test_run_dir_in_the_way_of_a_file(where, tmp_path, tiny_model, arithmetic_data):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    run_dir = blocker if where == "is_file" else blocker / "run"
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, run_dir=str(run_dir))
    code, out = run_train(tmp_path, cfg)
    assert_clean_refusal(code, out, "run_dir=", "file")
    assert blocker.read_text() == "not a directory"


# ---------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model, arithmetic_data):
    """A 3-iteration run with a checkpoint after each iteration (kept: all three)."""
    root = tmp_path_factory.mktemp("finished")
    cfg = run_config(root, tiny_model, arithmetic_data, iterations=3, val_every=0)
    cfg["data"]["val_path"] = None
    cfg["checkpoint"] = {"every": 1, "keep_last": 3}
    ascent_here("train", str(write_yaml(root / "r.yaml", cfg)))
    return root, cfg


def copy_run(finished_run, tmp_path):
    root, cfg = finished_run
    shutil.copytree(root / "run", tmp_path / "run")
    return dict(cfg, run_dir=str(tmp_path / "run"))


def test_resume_refuses_changes_that_break_exactness(finished_run, tmp_path):
    cfg = copy_run(finished_run, tmp_path)
    before = (tmp_path / "run" / "config.yaml").read_text()
    cfg = json.loads(json.dumps(cfg))
    cfg["iterations"], cfg["train"]["lr"], cfg["algorithm"] = 4, 5e-4, {"advantage": "rloo"}
    code, out = run_train(tmp_path, cfg, "--resume")
    assert_clean_refusal(code, out, "train.lr", "algorithm.advantage", "--accept-changes")
    assert (tmp_path / "run" / "config.yaml").read_text() == before  # the refused run changed nothing
    code, out = run_train(tmp_path, cfg, "--resume", "--accept-changes")
    assert code == 0, out
    assert (tmp_path / "run" / "checkpoints" / "iter_000004").is_dir()


def test_resume_with_harmless_changes_and_a_finished_run(finished_run, tmp_path):
    cfg = copy_run(finished_run, tmp_path)
    code, out = run_train(tmp_path, dict(cfg, tracking={"progress": False, "tensorboard": False}), "--resume")
    assert code == 0 and "already finished" in out, out
    code, out = run_train(tmp_path, dict(cfg, iterations=2), "--resume")
    assert_clean_refusal(code, out, "iterations=2", "iter_000003")


def test_resume_names_a_damaged_checkpoint_and_offers_the_previous(finished_run, tmp_path):
    cfg = copy_run(finished_run, tmp_path)
    newest = tmp_path / "run" / "checkpoints" / "iter_000003"
    (newest / "trainer_state.pt").write_bytes(b"")
    code, out = run_train(tmp_path, dict(cfg, iterations=4), "--resume")
    assert_clean_refusal(code, out, "iter_000003", "trainer_state.pt", "--resume-from iter_000002")
    code, out = run_train(tmp_path, dict(cfg, iterations=4), "--resume-from", "iter_000002")
    assert code == 0, out
    assert "resumed from" in out and "iter_000002" in out


def scribble_over_pickle(file):
    """Invert the bytes of the pickled record in torch.save's zip `file`: its central directory still reads
    (verify_checkpoint's cheap check passes), torch.load fails."""
    with zipfile.ZipFile(file) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data.pkl"))
    data = bytearray(file.read_bytes())
    at = info.header_offset
    start = (
        at
        + 30
        + int.from_bytes(data[at + 26 : at + 28], "little")
        + int.from_bytes(data[at + 28 : at + 30], "little")
    )
    data[start : start + info.compress_size] = bytes(
        b ^ 0xFF for b in data[start : start + info.compress_size]
    )
    file.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["scribbled", "missing"])
def test_resume_names_an_unloadable_trainer_state(damage, finished_run, tmp_path):
    cfg = copy_run(finished_run, tmp_path)
    state = tmp_path / "run" / "checkpoints" / "iter_000003" / "trainer_state.pt"
    scribble_over_pickle(state) if damage == "scribbled" else state.unlink()
    code, out = run_train(tmp_path, dict(cfg, iterations=4), "--resume")
    problem = "trainer_state.pt is not loadable" if damage == "scribbled" else "trainer_state.pt is missing"
    assert_clean_refusal(code, out, "iter_000003", problem, "--resume-from iter_000002")


def test_resume_notices_other_model_contents_under_the_same_path(tmp_path, tiny_model, arithmetic_data):
    from ascent.models.tiny import make_tiny_checkpoint

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    cfg = run_config(tmp_path, model, arithmetic_data, iterations=1, val_every=0)
    cfg["data"]["val_path"] = None
    ascent_here("train", str(write_yaml(tmp_path / "r.yaml", cfg)))
    shutil.rmtree(model)
    make_tiny_checkpoint(model, hidden_size=32, num_layers=2, seed=1)  # same shape, other weights
    code, out = run_train(tmp_path, dict(cfg, iterations=2), "--resume")
    assert_clean_refusal(code, out, "model.path", "files changed")


def test_checkpoint_write_failure_leaves_nothing_half_written(tmp_path):
    import errno

    from ascent.orchestrator import checkpointing

    def write_ok(d):
        (tmp_path / "marker").write_text(d)

    checkpointing.commit(tmp_path / "run", 1, [write_ok], {}, keep_last=2)

    def disk_full(d):
        raise OSError(errno.ENOSPC, "No space left on device", d)

    with pytest.raises(checkpointing.CheckpointWriteError) as err:
        checkpointing.commit(tmp_path / "run", 2, [disk_full], {}, keep_last=2)
    message = str(err.value)
    assert "No space left on device" in message and "iter_000001 is intact" in message
    left = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert left == ["iter_000001"]


def sft_config(tmp_path, tiny_model, arithmetic_data):
    """3 optimizer steps of 8 pairs, a checkpoint after each of the first two."""
    return {
        "run_dir": str(tmp_path / "sft"),
        "epochs": 0.5,
        "batch_size": 8,
        "model": {"path": str(tiny_model)},
        "data": {"train_path": str(arithmetic_data / "sft.jsonl"), "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 128},
        "checkpoint": {"every": 1, "keep_last": 3},
        "tracking": {"progress": False, "tensorboard": False},
    }


def test_sft_killed_while_writing_final_leaves_the_previous_final_whole(
    tmp_path, tiny_model, arithmetic_data, monkeypatch
):
    from transformers import PreTrainedTokenizerBase

    cfg = sft_config(tmp_path, tiny_model, arithmetic_data)
    del cfg["checkpoint"]  # no checkpoint saves: the kill below lands in the writing of final/
    ascent_here("sft", str(write_yaml(tmp_path / "sft.yaml", cfg)))
    final = tmp_path / "sft" / "final"
    before = {p.name: p.read_bytes() for p in final.iterdir()}

    def killed(self, *args, **kwargs):  # the weights are written, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", killed)
    again = ascent_here("sft", str(write_yaml(tmp_path / "sft.yaml", dict(cfg, seed=1))), check=False)
    assert again.returncode == 130, again.stdout + again.stderr
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before  # not new weights beside old files
    assert [p.name for p in final.parent.iterdir() if p.name.endswith("final")] == ["final"]  # no copy left


def test_resume_names_a_state_json_missing_its_keys(finished_run, tmp_path):
    cfg = copy_run(finished_run, tmp_path)
    (tmp_path / "run" / "checkpoints" / "iter_000003" / "state.json").write_text('{"iteration": 3}')
    for extra in ((), ("--accept-changes",)):
        code, out = run_train(tmp_path, dict(cfg, iterations=4), "--resume", *extra)
        needles = ["iter_000003", "state.json", "lacks", "config", "sampler", "--resume-from iter_000002"]
        assert_clean_refusal(code, out, *needles)
        assert "other settings" not in out, out


def test_an_rl_run_does_not_resume_an_sft_checkpoint_nor_the_reverse(
    finished_run, tmp_path, tiny_model, arithmetic_data
):
    sft = sft_config(tmp_path, tiny_model, arithmetic_data)
    ascent_here("sft", str(write_yaml(tmp_path / "sft.yaml", sft)))
    sft_ckpt = tmp_path / "sft" / "checkpoints" / "iter_000001"
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=2)
    code, out = run_train(tmp_path, cfg, "--resume-from", str(sft_ckpt), "--accept-changes")
    assert_clean_refusal(code, out, str(sft_ckpt), "SFT checkpoint", "model.path=", "final")
    assert not (tmp_path / "run" / "checkpoints").exists()

    rl_ckpt = finished_run[0] / "run" / "checkpoints" / "iter_000001"
    sft_yaml = write_yaml(tmp_path / "sft2.yaml", dict(sft, run_dir=str(tmp_path / "sft2")))
    proc = ascent_here("sft", str(sft_yaml), "--resume-from", str(rl_ckpt), "--accept-changes", check=False)
    assert_clean_refusal(proc.returncode, proc.stdout + proc.stderr, str(rl_ckpt), "RL checkpoint")


def test_a_checkpoints_path_in_the_way_is_refused_before_training(tmp_path, tiny_model, arithmetic_data):
    (tmp_path / "run").mkdir()
    blocker = tmp_path / "run" / "checkpoints"
    blocker.write_text("not a directory")
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=1, val_every=0)
    code, out = run_train(tmp_path, cfg)
    assert_clean_refusal(code, out, str(blocker), "is a file", "remove")
    assert "Free space" not in out and "iteration 1" not in out, out
    assert blocker.read_text() == "not a directory"
