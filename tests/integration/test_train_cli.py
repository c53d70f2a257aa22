"""`ascent train` end to end on a tiny model: the inline and the Ray backend produce a complete run."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ascent, ascent_here, run_config, write_yaml
from safetensors.torch import load_file


def check_run(run_dir, iterations: int) -> None:
    from transformers import AutoModelForCausalLM

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x["step"] for x in lines if "reward/mean" in x]
    assert steps == list(range(1, iterations + 1))
    last = lines[-1]
    for key in (
        "reward/mean",
        "rollout/logprob_diff_mean",
        "rollout/logprob_diff_max",
        "val/accuracy",
        "loss/policy",
    ):
        assert key in last, key
    # sampler and trainer compute the same distribution on the same weights (fp32, CPU)
    assert last["rollout/logprob_diff_max"] < 1e-3
    assert any((run_dir / "tensorboard").iterdir())
    trace = json.loads((run_dir / "trace.json").read_text())
    assert {"rollout", "reward", "update", "publish"} <= {e["name"] for e in trace["traceEvents"]}
    assert (run_dir / "config.yaml").exists()
    assert (run_dir / "logs" / "controller.log").exists()
    ckpt = sorted((run_dir / "checkpoints").glob("iter_*"))[-1]
    assert ckpt.name == f"iter_{iterations:06d}"
    AutoModelForCausalLM.from_pretrained(ckpt)  # a checkpoint is a plain HF model directory


def test_train_inline(tmp_path, tiny_model, arithmetic_data):
    val = {"rollout.val_samples_per_prompt": 2, "rollout.val_temperature": 1.0, "rollout.val_pass_k": [1, 2]}
    cfg = write_yaml(tmp_path / "run.yaml", run_config(tmp_path, tiny_model, arithmetic_data, **val))
    ascent_here("train", str(cfg))
    check_run(tmp_path / "run", 3)
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    # validation's pass@k over 2 samples per prompt, also per data_source (every row is "addition")
    assert last["val/pass@1"] <= last["val/pass@2"] and last["val/pass@1"] == last["val/accuracy"]
    assert last["val/source/addition/pass@2"] == last["val/pass@2"]


@pytest.mark.slow
def test_train_ray_backend_same_run_over_either_weight_transport(
    tmp_path, tiny_model, arithmetic_data, ray_address
):
    """Ray actors, colocated, the fast engine; the weights reach the replica over a gloo broadcast or through
    the object store, and the two runs are the same run (same samples, same losses): the transport moves
    bytes, nothing else."""
    runs = {}
    for transport in ("broadcast", "object_store"):
        cfg = run_config(tmp_path / transport, tiny_model, arithmetic_data, iterations=2, val_every=0)
        cfg["rollout"] |= {"engine": "fast"}  # colocated with the fast engine: it sleeps through the update
        cfg["cluster"] = {
            "backend": "ray",
            "address": ray_address,
            "weight_transport": transport,
            "weight_bucket_mb": 1,
        }
        ascent("train", str(write_yaml(tmp_path / f"{transport}.yaml", cfg)), timeout=600)
        run = tmp_path / transport / "run"
        check_run(run, 2)
        assert list((run / "logs").glob("trainer*.log"))
        assert f"weight transport: {transport}" in (run / "logs" / "controller.log").read_text()
        runs[transport] = _metric_lines(run)
        # colocated on Ray: every trainer rank is asked to release its cached GPU blocks (none on a CPU)
        assert [r["memory/trainer_released_gib"] for r in runs[transport]] == [0.0, 0.0]
    keys = ("loss/policy", "reward/mean", "rollout/response_len_mean", "rollout/logprob_diff_mean")
    for a, b in zip(runs["broadcast"], runs["object_store"], strict=True):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


@pytest.mark.slow
def test_train_ray_two_sharded_trainer_ranks(tmp_path, tiny_model, arithmetic_data, ray_address):
    """Two trainer ranks (FSDP2 over gloo) and a rollout actor: the multi-process path of a cluster run. Its
    mid-run checkpoint holds DCP shards only (checkpoint.hf_weights=last); one trainer rank resumes from it
    and ends where the two ranks did."""
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=2, val_every=0)
    cfg["cluster"] = {
        "backend": "ray",
        "address": ray_address,
        "num_trainer_workers": 2,
        "cpus_per_worker": 0.5,
    }
    cfg["train"]["sharding"] = "fsdp"
    # the untrained model earns no reward, so every advantage is 0: step anyway, or AdamW would hold no state
    # for the DCP checkpoint to shard (train.step_on_zero_advantage, issue #26)
    cfg["train"]["step_on_zero_advantage"] = True
    cfg["checkpoint"] = {"every": 1, "keep_last": 2, "hf_weights": "last"}
    ascent("train", str(write_yaml(tmp_path / "run.yaml", cfg)), timeout=600)
    check_run(tmp_path / "run", 2)
    first, last = sorted((tmp_path / "run" / "checkpoints").glob("iter_*"))
    for ckpt in (first, last):
        assert (ckpt / "model_shards" / ".metadata").is_file()
        assert (ckpt / "optimizer_shards" / ".metadata").is_file()  # AdamW through DCP: any rank count
        assert {p.name for p in ckpt.glob("rng_rank*")} == {"rng_rank00000.pt", "rng_rank00001.pt"}
    assert not (first / "model.safetensors").exists()  # nothing gathered mid-run
    two_ranks = load_file(str(last / "model.safetensors"))

    cfg["cluster"]["num_trainer_workers"] = 1  # not a change that blocks --resume
    ascent("train", str(write_yaml(tmp_path / "one.yaml", cfg)), "--resume-from", first.name, timeout=600)
    one_rank = load_file(str(last / "model.safetensors"))
    assert one_rank.keys() == two_ranks.keys()
    for name, t in two_ranks.items():
        torch.testing.assert_close(one_rank[name], t, atol=1e-5, rtol=0, msg=name)


def test_an_awake_engine_changes_nothing_but_memory_at_staleness_zero(tmp_path, tiny_model, arithmetic_data):
    """cluster.engine_sleeps=false with synchronous RL: the colocated fast engine keeps its KV cache and
    weights through the update instead of sleeping, and the run is the same run: the same rewards, and the
    same final weights bit for bit (no K/V or weights of an older version survive a publication)."""
    finals = {}
    for sleeps in (True, False):
        cfg = run_config(tmp_path / str(sleeps), tiny_model, arithmetic_data, iterations=2, val_every=0)
        cfg["rollout"] |= {"engine": "fast"}
        cfg["cluster"] = {"device": "cpu", "placement": "colocated", "engine_sleeps": sleeps}
        ascent_here("train", str(write_yaml(tmp_path / f"{sleeps}.yaml", cfg)))
        run = tmp_path / str(sleeps) / "run"
        lines = _metric_lines(run)
        finals[sleeps] = (
            [x["reward/mean"] for x in lines],
            load_file(str(sorted((run / "checkpoints").glob("iter_*"))[-1] / "model.safetensors")),
        )
        assert ("memory/trainer_released_gib" in lines[-1]) == sleeps  # only a sleeping engine is woken
    assert finals[True][0] == finals[False][0]
    assert finals[True][1].keys() == finals[False][1].keys()
    assert all(torch.equal(finals[True][1][k], finals[False][1][k]) for k in finals[True][1])


def _metric_lines(run_dir) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "loss/policy" in x]


def test_single_step_iterations_skip_the_old_logprob_pass(tmp_path, tiny_model, arithmetic_data):
    """One optimizer step per iteration: `auto` reuses the update's logprobs, `recompute` runs the separate
    pass; both give the same run (same math, ratio 1) and both report the sampler/trainer mismatch."""
    runs = {}
    for mode in ("auto", "recompute"):
        cfg = run_config(tmp_path / mode, tiny_model, arithmetic_data, iterations=2, val_every=0)
        cfg["train"] |= {"trajectories_per_update": 8, "old_logprobs": mode}
        cfg["checkpoint"] = {"every": 0}
        ascent_here("train", str(write_yaml(tmp_path / f"{mode}.yaml", cfg)))
        runs[mode] = _metric_lines(tmp_path / mode / "run")
    for fused, separate in zip(runs["auto"], runs["recompute"], strict=True):
        assert fused["train/old_logprob_pass"] == 0.0 and separate["train/old_logprob_pass"] == 1.0
        for key in ("train/optimizer_steps", "train/skipped_steps"):  # all-zero advantages: not stepped
            assert fused[key] == separate[key]
        assert fused["train/optimizer_steps"] + fused["train/skipped_steps"] == 1.0
        for key in ("reward/mean", "loss/policy", "grad_norm", "entropy", "rollout/logprob_diff_mean"):
            assert fused[key] == pytest.approx(separate[key], rel=1e-4, abs=1e-6), key
        assert fused["rollout/logprob_diff_max"] < 1e-3


def test_colocated_fast_engine_round_trip(tmp_path, tiny_model, arithmetic_data):
    """The colocated loop with the fast engine (CPU, fp32): after each rollout the engine sleeps and frees
    its weights, the trainer runs the old-logprob pass and two updates, a full set of weights is published
    and the engine wakes. Iterations 2 and 3 sample with the published weights, so sampler and trainer must
    still agree on every token's logprob."""
    cfg = run_config(tmp_path, tiny_model, arithmetic_data, iterations=3, val_every=0)
    cfg["rollout"] |= {"engine": "fast"}
    cfg["train"] |= {"old_logprobs": "recompute"}  # 2 optimizer steps per iteration: the pass runs anyway
    cfg["cluster"] = {"device": "cpu", "placement": "colocated"}
    cfg["checkpoint"] = {"every": 0}
    ascent_here("train", str(write_yaml(tmp_path / "run.yaml", cfg)))
    lines = _metric_lines(tmp_path / "run")
    assert [x["step"] for x in lines] == [1, 2, 3]
    for x in lines:
        assert x["train/old_logprob_pass"] == 1.0
        assert x["train/optimizer_steps"] + x["train/skipped_steps"] == 2.0
        assert x["rollout/logprob_diff_max"] < 1e-3, x["step"]
        # the KV pool this rollout had (on CPU: max_batch_size sequences of max_model_len, never capped)
        assert x["rollout/kv_tokens"] == lines[0]["rollout/kv_tokens"] > 0
