"""The doctor's dataset checks (files exist, their first rows parse and hold what the run reads), the local
model directory checked before transformers sees it (never a hub lookup), and the RAM of a run on the CPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ascent.config.schema import RunConfig
from ascent.doctor import data, model, plan, run, system
from ascent.doctor.memory import GIB

CPU = system.GpuFacts("2.13.0+cpu")


def cfg(**sections) -> RunConfig:
    return RunConfig.model_validate(sections)


def jsonl(path: Path, rows: list[object]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_missing_or_unset_data_fails_naming_the_field(tmp_path: Path) -> None:
    unset, missing = data.check_data(cfg(data={"val_path": str(tmp_path / "val.jsonl")}))
    assert unset.status == "fail" and unset.detail == "data.train_path is not set"
    assert (
        missing.status == "fail"
        and missing.name == "data: val"
        and "val.jsonl' does not exist" in missing.detail
    )


def test_the_first_rows_must_parse_and_hold_the_prompt_and_answer(tmp_path: Path) -> None:
    good = jsonl(tmp_path / "good.jsonl", [{"prompt": "1+1=", "answer": "2"}] * 3)
    assert data.check_split(cfg(), "train", good).status == "ok"
    no_answer = jsonl(tmp_path / "no_answer.jsonl", [{"prompt": "1+1="}, {"prompt": "2+2=", "answer": "4"}])
    result = data.check_split(cfg(), "train", no_answer)
    assert (
        result.status == "fail"
        and "row 1: field 'answer' is missing, and reward exact_match reads" in result.detail
    )
    assert (
        data.check_split(cfg(reward={"fn": "format"}), "train", no_answer).status == "ok"
    )  # reads no answer
    other_key = cfg(reward={"kwargs": {"answer_key": "label"}})
    assert "field 'label' is missing" in data.check_split(other_key, "train", good).detail
    no_prompt = jsonl(tmp_path / "no_prompt.jsonl", [{"question": "?", "answer": "1"}])
    assert "row 1: field 'prompt' is missing" in data.check_split(cfg(), "train", no_prompt).detail
    mapped = cfg(data={"prompt_key": "question"})  # data.prompt_key names the column the run reads
    assert data.check_split(mapped, "train", no_prompt).status == "ok"
    wrong = data.check_split(cfg(data={"prompt_key": "q"}), "train", no_prompt)
    assert wrong.status == "fail" and "data.prompt_key='q' names no column" in wrong.detail
    env_rows = jsonl(tmp_path / "env.jsonl", [{"target": 3}])  # the environment reads its rows
    assert (
        data.check_split(
            cfg(rollout={"source": {"name": "env", "env": "guess_number"}}), "train", env_rows
        ).status
        == "ok"
    )


def test_only_the_head_of_a_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"prompt": "p", "answer": "a"}) + "\n" + "}{ not json\n" * 3)
    assert data.head_rows(path, 1) == [{"prompt": "p", "answer": "a"}]
    broken = data.check_split(cfg(), "train", str(path))
    assert broken.status == "fail" and "line 2: not valid JSON" in broken.detail
    table = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": str(i), "answer": str(i)} for i in range(120)]), table)
    assert len(data.head_rows(table, data.HEAD_ROWS)) == data.HEAD_ROWS


def test_a_missing_model_directory_is_reported_without_transformers(tmp_path: Path, tiny_dir: Path) -> None:
    gone = cfg(model={"path": str(tmp_path / "nope")})
    result, shape = model.check_model(gone)
    assert shape is None and result.status == "fail" and "no such directory" in result.detail
    tok = model.check_tokenizer(gone)
    assert tok.status == "fail" and tok.detail.startswith("model.path=") and "no such directory" in tok.detail
    tok_dir = model.check_tokenizer(cfg(model={"path": str(tiny_dir), "tokenizer_path": str(tmp_path)}))
    assert tok_dir.detail.startswith("model.tokenizer_path=") and "has no tokenizer.json or" in tok_dir.detail


def test_a_cpu_run_gets_a_host_memory_estimate(monkeypatch, tiny_dir: Path, rows_file: Path) -> None:
    monkeypatch.setattr(system, "gpu_facts", lambda: CPU)
    config = cfg(
        model={"path": str(tiny_dir)}, data={"train_path": str(rows_file)}, cluster={"device": "cpu"}
    )
    for (total, free), status in (
        ((64 * GIB, 32 * GIB), "ok"),
        ((64 * GIB, GIB // 2), "warn"),
        ((GIB // 2,) * 2, "fail"),
    ):
        monkeypatch.setattr(system, "host_memory", lambda t=total, f=free: (t, f))
        host = run.run_checks(config).results[-1]
        assert host.name == "host memory (CPU run)" and host.status == status, host
    needed, _ = plan.host_bytes_needed(config, run.run_checks(config).estimate)
    assert host.data["needed_bytes"] == needed > plan.PROCESS_RUNTIME
    assert "memory per GPU" not in [r.name for r in run.run_checks(config).results]


def test_host_memory_reads_meminfo(tmp_path: Path) -> None:
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    8192 kB\n")
    assert system.host_memory(str(info)) == (16384 * 1024, 8192 * 1024)


def test_a_saved_datasets_directory_is_read_with_its_split(tmp_path: Path) -> None:
    import datasets  # the dev install holds the optional `datasets`

    rows = [{"question": "1+1=", "solution": "2"}]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "d"))
    keys = {"prompt_key": "question", "answer_key": "solution"}
    assert data.check_split(cfg(data=keys), "train", str(tmp_path / "d")).status == "ok"
    bad = data.check_split(cfg(data={**keys, "split": "train"}), "train", str(tmp_path / "d"))
    assert bad.status == "fail" and "data.split='train' is not a split" in bad.detail


def test_ray_temp_dir_default_follows_rays_own_rule() -> None:
    assert run.ray_default_temp_dir({}) == "/tmp/ray"
    assert run.ray_default_temp_dir({"TMPDIR": "/scratch/me"}) == "/scratch/me/ray"
    assert run.ray_default_temp_dir({"TMPDIR": "/scratch", "RAY_TMPDIR": "/big"}) == "/big/ray"


def test_a_reward_import_path_that_does_not_resolve_fails_the_doctor(tmp_path: Path, monkeypatch) -> None:
    # before: every check passed (exit 0) and `ascent train` then stopped at start-up on the import path
    from ascent.doctor import plugins

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader adds the current directory to both
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.delitem(sys.modules, "doc_rewards_q", raising=False)
    (tmp_path / "doc_rewards_q.py").write_text(
        "def score(prompt, response, ids, metadata):\n    return 1.0\n"
    )
    bad = plugins.check_plugins(cfg(reward={"fn": "doc_rewards_q:scor"}))
    assert bad.status == "fail" and "reward.fn='doc_rewards_q:scor'" in bad.detail and "score" in bad.detail
    unbound = plugins.check_plugins(cfg(reward={"fn": "doc_rewards_q:score", "kwargs": {"scale": 2}}))
    assert unbound.status == "fail" and "cannot be called" in unbound.detail
    assert plugins.check_plugins(cfg(reward={"fn": "doc_rewards_q:score"})).status == "ok"
    assert plugins.check_plugins(cfg(algorithm={"advantage": "nosuch_pkg_q:adv"})).status == "fail"
