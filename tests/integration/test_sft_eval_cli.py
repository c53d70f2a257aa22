"""`ascent sft` lowers the response NLL and writes an HF checkpoint that `ascent eval` and `train` read."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, ascent, ascent_here, write_yaml

from ascent.tracking import read_status


def test_sft_then_eval(tmp_path, tiny_model, arithmetic_data):
    cfg = {
        "run_dir": str(tmp_path / "sft"),
        "epochs": 3.0,
        "batch_size": 8,
        "model": {"path": str(tiny_model)},
        "data": {"train_path": str(arithmetic_data / "sft.jsonl"), "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 128},
        "tracking": {"progress": False},
    }
    proc = ascent("sft", str(write_yaml(tmp_path / "sft.yaml", cfg)))  # stdout is a pipe, not a terminal
    lines = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["sft/nll"] < lines[0]["sft/nll"]
    # plain progress lines on stdout (the first and last step at least; 15 steps of 40 pairs x 3 / 8)
    steps = [line for line in proc.stdout.splitlines() if line.startswith("it ")]
    assert steps[0].startswith("it 1/15 | nll ") and "tok/s" in steps[0] and "eta" in steps[0]
    assert steps[-1].startswith("it 15/15 | nll ") and "\x1b" not in proc.stdout
    status = read_status(tmp_path / "sft")
    assert (status["state"], status["kind"], status["step"]) == ("finished", "sft", lines[-1]["step"])
    final = tmp_path / "sft" / "final"
    assert (final / "model.safetensors").exists() and (final / "tokenizer.json").exists()
    out = tmp_path / "responses.jsonl"
    proc = ascent(
        "eval",
        "--model",
        str(final),
        "--data",
        str(arithmetic_data / "val.jsonl"),
        "--max-new-tokens",
        "4",
        "--samples",
        "2",
        "--temperature",
        "1.0",
        "--pass-k",
        "1,2",
        "--out",
        str(out),
    )
    assert "accuracy" in proc.stdout and "it 1/1 | " in proc.stdout  # 32 samples: one part, one progress line
    assert "deprecated" not in proc.stderr  # our forward calls use transformers' current argument names
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 32 and all(r["reward"] in (0.0, 1.0) for r in rows)
    # pass@k from the 2 samples of each row (Chen et al.'s estimator), and per data_source (all "addition")
    shown = dict(
        line.split(": ") for line in proc.stdout.splitlines() if line.startswith(("pass@", "source/"))
    )
    by_row: dict[int, list[float]] = {}
    for r in rows:
        by_row.setdefault(r["row_id"], []).append(r["reward"])
    assert float(shown["pass@2"]) == pytest.approx(sum(max(v) for v in by_row.values()) / 16, abs=1e-4)
    assert float(shown["pass@1"]) == pytest.approx(sum(r["reward"] for r in rows) / 32, abs=1e-4)
    assert shown["source/addition/pass@2"] == shown["pass@2"]


def test_pick_warm_start_scans_sft_checkpoints_in_order(
    tmp_path, tiny_model, arithmetic_data, monkeypatch, capsys
):
    """examples/arithmetic/pick_warm_start.py (run_gpu.sh): the first SFT checkpoint at or above the accuracy
    bar, scored on the given prompts; the final weights when none reaches it. Then a second `ascent sft` into
    the same run_dir is refused. (The script runs as `__main__` in this process, its command line in
    sys.argv: a new interpreter would spend seconds importing torch twice.)"""
    import runpy
    import sys
    from types import SimpleNamespace

    cfg = {
        "run_dir": str(tmp_path / "sft"),
        "epochs": 1.0,  # 40 pairs / 8 = 5 steps: checkpoints at 2 and 4, then final
        "batch_size": 8,
        "model": {"path": str(tiny_model)},
        "data": {"train_path": str(arithmetic_data / "sft.jsonl"), "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 128},
        "checkpoint": {"every": 2, "keep_last": 10},
        "tracking": {"progress": False},
    }
    ascent_here("sft", str(write_yaml(tmp_path / "sft.yaml", cfg)))

    def pick(bar: float) -> SimpleNamespace:
        script = ROOT / "examples" / "arithmetic" / "pick_warm_start.py"
        args = ["--sft", str(tmp_path / "sft"), "--data", str(arithmetic_data / "train.jsonl")]
        monkeypatch.setattr(sys, "argv", [str(script), *args, "--min-accuracy", str(bar), "--prompts", "8"])
        capsys.readouterr()
        runpy.run_path(str(script), run_name="__main__")
        out = capsys.readouterr()
        return SimpleNamespace(stdout=out.out, stderr=out.err)

    first = pick(0.0)
    assert first.stdout.strip() == str(tmp_path / "sft" / "checkpoints" / "iter_000002")
    assert "iter_000004" not in first.stderr
    none = pick(1.01)
    assert none.stdout.strip() == str(tmp_path / "sft" / "final")
    scanned = [line.split(":")[0] for line in none.stderr.splitlines() if "accuracy" in line]
    assert scanned == ["iter_000002", "iter_000004", "final"]

    # like `ascent train`, a second SFT into a run_dir with checkpoints refuses instead of mixing two runs
    again = ascent_here("sft", str(tmp_path / "sft.yaml"), check=False)
    assert (
        again.returncode == 2 and "already holds checkpoints" in again.stderr and "--resume" in again.stderr
    )


def test_sft_row_errors_name_the_setting_the_file_and_the_row(tmp_path, tiny_model):
    # before: "dataset row 2: field 'response' is missing", naming neither the file nor the setting
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "1+1=", "response": "2"}\n{"prompt": "2+2="}\n')
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": 3}]}) + "\n")
    cfg = {
        "run_dir": str(tmp_path / "sft"),
        "model": {"path": str(tiny_model)},
        "data": {"train_path": str(pairs), "max_prompt_tokens": 32},
        "tracking": {"progress": False, "tensorboard": False},
    }
    proc = ascent_here("sft", str(write_yaml(tmp_path / "pairs.yaml", cfg)), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: data.train_path={pairs} row 2: field 'response' is missing" in proc.stderr
    cfg["data"] |= {"train_path": str(pairs.with_name("good.jsonl")), "val_path": str(chats)}
    pairs.with_name("good.jsonl").write_text('{"prompt": "1+1=", "response": "2"}\n')
    cfg["run_dir"] = str(tmp_path / "sft2")
    proc = ascent_here("sft", str(write_yaml(tmp_path / "chats.yaml", cfg)), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: data.val_path={chats}: row 1: field 'messages' message 0: 'content' is of type int" in (
        proc.stderr
    )


def test_eval_refuses_when_every_reward_call_fails(tmp_path, tiny_model):
    rows = tmp_path / "no_answers.jsonl"
    rows.write_text("".join(f'{{"prompt": "{i}+1="}}\n' for i in range(4)))  # exact_match needs `answer`
    proc = ascent_here(
        "eval", "--model", str(tiny_model), "--data", str(rows), "--max-new-tokens", "2", check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "--reward exact_match: all 4 reward calls failed, so there is no accuracy to report" in out
    assert "first error on row 1: " in out and "answer" in out and "Traceback" not in out
    # the missing answer's fix in eval's option (before: train's reward.kwargs.answer_key)
    assert "name the column that holds it with --answer-key" in out and "reward.kwargs" not in out
    # eval's own options, not train's (before: "... or raise reward.max_failure_rate", which eval lacks)
    assert (
        "reward.max_failure_rate" not in out and "raise --reward-timeout-s=30 if the calls timed out" in out
    )
    config = tmp_path / "reward.yaml"
    config.write_text("reward:\n  fn: exact_match\n")
    proc = ascent_here(
        "eval", "--model", str(tiny_model), "--data", str(rows), "--reward-config", str(config), check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "reward.max_failure_rate" not in out, out
    assert f"--reward-config {config} (reward.fn=exact_match): all 4 reward calls failed" in out
    bad = ascent_here(
        "eval", "--model", str(tiny_model), "--data", str(rows), "--reward", "nosuch.mod:fn", check=False
    )
    assert bad.returncode == 2 and "nosuch" in bad.stderr and "Traceback" not in bad.stderr


def test_eval_with_the_fast_engine_and_a_dtype(tmp_path, tiny_model, arithmetic_data):
    args = ["--model", str(tiny_model), "--data", str(arithmetic_data / "val.jsonl"), "--max-new-tokens", "3"]
    ref = ascent_here("eval", *args)
    fast = ascent_here("eval", *args, "--engine", "fast", "--dtype", "fp32")

    def accuracy(out: str) -> list[str]:  # the result lines, not the progress lines before them
        return [line for line in out.splitlines() if line.startswith("accuracy")]

    assert accuracy(fast.stdout) and accuracy(ref.stdout) == accuracy(fast.stdout)
    bad = ascent_here("eval", *args, "--dtype", "fp8", check=False)
    assert bad.returncode == 2 and "--dtype fp8" in bad.stderr


def _sft_run(root, model, data, name: str, **extra) -> dict:
    """`ascent sft` for one epoch into root/name -> its final weights (an inline run in this process, a Ray
    run in a process of its own: its Ray driver ends with the command)."""
    from safetensors.torch import load_file

    cfg = {
        "run_dir": str(root / name),
        "epochs": 1.0,
        "batch_size": 8,
        "model": {"path": str(model)},
        "data": {"train_path": str(data / "sft.jsonl"), "max_prompt_tokens": 32},
        "train": {"lr": 3e-3, "max_tokens_per_micro_batch": 128, "sharding": extra.pop("sharding", "none")},
        "tracking": {"progress": False},
        **extra,
    }
    if "cluster" in cfg:
        ascent("sft", str(write_yaml(root / f"{name}.yaml", cfg)), timeout=600)
    else:
        ascent_here("sft", str(write_yaml(root / f"{name}.yaml", cfg)))
    return load_file(root / name / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def one_rank_sft(tmp_path_factory, tiny_model, arithmetic_data) -> dict:
    """The inline one-rank SFT both sharding cases compare against (the same run for either: read only)."""
    return _sft_run(tmp_path_factory.mktemp("sft_one"), tiny_model, arithmetic_data, "one")


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_sft_on_two_trainer_ranks_equals_one(
    tmp_path, tiny_model, arithmetic_data, ray_address, sharding, one_rank_sft
):
    """`cluster.num_trainer_workers=2` on a local Ray cluster (gloo): each batch split over two data-parallel
    ranks (replicated or FSDP2-sharded) gives the weights one inline rank gives, to fp32 rounding."""
    import torch
    from safetensors.torch import load_file

    one = one_rank_sft
    two = _sft_run(
        tmp_path,
        tiny_model,
        arithmetic_data,
        "two",
        sharding=sharding,
        cluster={
            "backend": "ray",
            "address": ray_address,
            "num_trainer_workers": 2,
            "cpus_per_worker": 0.5,
        },
    )
    assert one.keys() == two.keys()
    start = load_file(tiny_model / "model.safetensors")
    for name, w in one.items():
        assert not torch.equal(w, start[name]) or "norm" in name  # training moved the weights
        torch.testing.assert_close(two[name], w, rtol=1e-4, atol=1e-5, msg=name)
