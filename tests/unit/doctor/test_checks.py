"""Each doctor check with its failure simulated: versions, GPU capability, NCCL, Ray, disk, ports, trackers,
the model and tokenizer, the fast engine's architectures, rendering libraries, memory."""

from __future__ import annotations

import json
import socket
from collections import namedtuple

import pytest

from ascent.config.schema import RunConfig
from ascent.doctor import cluster, model, plan, run, system, tracking
from ascent.errors import AscentError

GIB = 2**30
H100 = system.GpuFacts("2.13.0", "13.0", "580.1", ["H100"], [80 * GIB], [(9, 0)], "2.27.3")
V100 = system.GpuFacts("2.13.0", "12.1", "535.0", ["V100"], [32 * GIB], [(7, 0)], "2.18.1")
CPU = system.GpuFacts("2.13.0+cpu")


def cfg(**sections) -> RunConfig:
    return RunConfig.model_validate(sections)


# ----------------------------------------------------------------------------------------- versions
def test_python_version():
    assert system.check_python((3, 12, 1)).status == "ok"
    old = system.check_python((3, 10, 4))
    assert old.status == "fail" and "3.11" in old.fix


def test_torch_outside_the_requirement_fails():
    assert system.check_torch(H100, ">=2.11,<2.14").status == "ok"
    bad = system.check_torch(system.GpuFacts("2.9.1+cu126"), ">=2.11,<2.14")
    assert bad.status == "fail" and ">=2.11" in bad.fix


def test_cuda_missing_fails_only_when_the_config_needs_a_gpu():
    assert system.check_cuda(CPU, needs_gpu=False).status == "skipped"
    missing = system.check_cuda(CPU, needs_gpu=True)
    assert missing.status == "fail" and "cluster.device=cpu" in missing.fix
    assert "580.1" in system.check_cuda(H100, needs_gpu=True).detail


def test_bf16_and_varlen_need_capability_8():
    low = system.check_capability(V100, "bf16", fast_engine=False, attention="varlen")
    assert [r.status for r in low] == ["fail", "fail"]
    assert "model.dtype=fp16" in low[0].fix and "train.attention=sdpa" in low[1].fix
    assert system.check_capability(V100, "fp16", False, "sdpa")[0].status == "ok"
    assert system.check_capability(H100, "bf16", False, "varlen")[0].status == "ok"


def test_fast_engine_without_triton_warns(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "triton" else real(name))
    result = system.check_triton((9, 0))
    assert result.status == "warn" and "triton" in result.fix


def test_nccl():
    assert system.check_nccl(H100, 1, 1).status == "skipped"
    no_nccl = system.GpuFacts("2.13.0", "13.0", None, ["A", "B"], [GIB, GIB], [(8, 0), (8, 0)], None)
    assert system.check_nccl(no_nccl, 2, 2).status == "fail"
    few = system.check_nccl(H100, 2, 2)
    assert few.status == "fail" and "num_trainer_workers" in few.fix
    two = system.GpuFacts("2.13.0", "13.0", None, ["A", "B"], [GIB, GIB], [(8, 0), (8, 0)], "2.27")
    assert system.check_nccl(two, 2, 2).status == "ok"


def test_gpus_needed_by_placement():
    assert plan.gpus_needed(cfg(cluster={"num_trainer_workers": 2})) == (2, 2)
    split = cfg(
        cluster={
            "backend": "ray",
            "placement": "split",
            "gpus_per_worker": 1,
            "num_trainer_workers": 2,
            "num_rollout_workers": 2,
        }
    )
    assert plan.gpus_needed(split) == (4, 4)


# ---------------------------------------------------------------------------------------------- Ray
def test_ray_not_importable_fails(monkeypatch):
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name: None)
    out = cluster.check_ray(cfg(cluster={"backend": "ray"}), 0)
    assert out[0].status == "fail" and "ascent[ray]" in out[0].fix
    assert cluster.check_ray(cfg(), 0)[0].status == "skipped"


def test_unreachable_ray_address_fails():
    with socket.socket() as s:  # a port nobody listens on: bind, do not listen
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        out = cluster.check_ray(cfg(cluster={"backend": "ray", "address": f"127.0.0.1:{port}"}), 0)
    assert (
        out[-1].status == "fail" and "cluster.address" in out[-1].detail and "ray start --head" in out[-1].fix
    )


def test_ray_resources_against_the_placement():
    colocated = cfg(
        cluster={"backend": "ray", "gpus_per_worker": 1, "num_trainer_workers": 2, "num_rollout_workers": 2}
    )
    need = cluster.demand(colocated)
    assert (need.gpus, need.cpus, need.one_node) == (2, 4, True)
    short = cluster.check_resources(need, {"GPU": 1, "CPU": 8}, "x")
    assert short.status == "fail" and "gpus_per_worker" in short.fix
    assert cluster.check_resources(need, {"GPU": 2, "CPU": 2}, "x").status == "fail"
    out = cluster.check_ray(cfg(cluster={"backend": "ray", "num_cpus": 1, "cpus_per_worker": 2}), 0)
    assert out[-1].status == "fail" and "cluster.cpus_per_worker" in out[-1].fix


def test_ray_resources_count_the_environment_actors():
    """Under Ray the environments are actors with CPUs of their own: 2 workers + 3 x 0.5 = 3.5 CPUs."""
    env = {
        "source": {"name": "env", "env": "guess_number", "max_episode_tokens": 256},
        "env_workers": 3,
        "env_cpus": 0.5,
    }
    ray_env = cfg(cluster={"backend": "ray", "num_cpus": 3}, rollout=env)
    assert (cluster.demand(ray_env).cpus, cluster.demand(ray_env).env_cpus) == (3.5, 1.5)
    out = cluster.check_ray(ray_env, 0)
    assert out[-1].status == "fail" and "rollout.env_workers x rollout.env_cpus" in out[-1].fix
    assert (
        cluster.demand(cfg(cluster={"backend": "ray"}, rollout=env | {"env_isolation": "inline"})).cpus == 2
    )
    assert cluster.demand(cfg(cluster={"backend": "ray"}, rollout=env | {"env_workers": None})).cpus == 2.5
    assert cluster.demand(cfg(rollout=env)).env_cpus == 0  # inline backend: processes, not actors


# ------------------------------------------------------------------------------------------ disk, ports
def test_disk_fails_below_and_warns_near_the_need(monkeypatch, tmp_path):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(system.shutil, "disk_usage", lambda p: usage(100 * GIB, 99 * GIB, 1 * GIB))
    low = system.check_disk("disk: run_dir", str(tmp_path / "new" / "run"), 2 * GIB, "ckpts", "run_dir")
    assert low.status == "fail" and "run_dir" in low.fix and str(tmp_path) in low.detail
    assert system.check_disk("d", str(tmp_path), GIB // 2 + GIB // 4, "x", "f").status == "warn"
    assert system.check_disk("d", str(tmp_path), GIB // 4, "x", "f").status == "ok"


def test_disk_need_grows_with_checkpoints_kept(tiny_dir):
    _, shape = model.check_model(cfg(model={"path": str(tiny_dir)}))
    assert shape is not None
    two = plan.run_dir_bytes(cfg(checkpoint={"keep_last": 2}, tracking={"experience_store": False}), shape)
    five = plan.run_dir_bytes(cfg(checkpoint={"keep_last": 5}, tracking={"experience_store": False}), shape)
    assert five - two == 3 * 12 * shape.params  # fp32 weights + AdamW moments per checkpoint


def test_a_used_port_fails():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        result = system.check_ports([port])
    assert result.status == "fail" and str(port) in result.detail
    assert system.check_ports([]).status == "ok"


# ------------------------------------------------------------------------------------------ trackers
def test_wandb_needs_a_key_unless_offline(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: object() if n == "wandb" else real(n))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    t = cfg(tracking={"wandb_project": "p"}).tracking
    nokey = tracking.check_wandb(t)
    assert nokey.status == "fail" and "wandb login" in nokey.fix
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password k3y\n")
    assert tracking.check_wandb(t).status == "ok"
    (tmp_path / "netrc").unlink()
    offline = cfg(tracking={"wandb_project": "p", "wandb_mode": "offline"}).tracking
    assert tracking.check_wandb(offline).status == "ok"


def test_wandb_not_installed(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n == "wandb" else real(n))
    result = tracking.check_wandb(cfg(tracking={"wandb_project": "p"}).tracking)
    assert result.status == "fail" and "pip install wandb" in result.fix


def test_mlflow_fields_read_with_getattr(monkeypatch):
    """tracking.mlflow_uri comes with another branch: a stand-in object carries it here."""
    import importlib.util
    from types import SimpleNamespace

    assert tracking.check_mlflow(cfg().tracking).status == "skipped"  # no field yet: skipped, no error
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: object() if n == "mlflow" else real(n))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        result = tracking.check_mlflow(
            SimpleNamespace(mlflow_uri=f"http://127.0.0.1:{port}", http_proxy=None)
        )
    assert result.status == "fail" and "mlflow server" in result.fix


# ------------------------------------------------------------------------------------------ model
def test_model_and_tokenizer_ok(tiny_dir):
    c = cfg(model={"path": str(tiny_dir)})
    result, shape = model.check_model(c)
    assert result.status == "ok" and shape is not None and shape.layers == 2 and shape.hidden == 32
    assert model.check_tokenizer(c).status == "ok"


def test_missing_model_dir_fails(tmp_path):
    result, shape = model.check_model(cfg(model={"path": str(tmp_path)}))
    assert result.status == "fail" and shape is None and "config.json" in result.detail


def test_tokenizer_without_chat_template_fails_when_prompts_need_it(tiny_copy):
    (tiny_copy / "chat_template.jinja").unlink()
    tok_cfg = json.loads((tiny_copy / "tokenizer_config.json").read_text())
    tok_cfg.pop("chat_template", None)
    (tiny_copy / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    result = model.check_tokenizer(cfg(model={"path": str(tiny_copy)}))
    assert result.status == "fail" and "data.chat_template=false" in result.fix
    raw = cfg(model={"path": str(tiny_copy)}, data={"chat_template": False})
    assert model.check_tokenizer(raw).status == "ok"


def test_unsupported_architecture_fails_for_the_fast_engine(tiny_copy):
    conf = json.loads((tiny_copy / "config.json").read_text())
    conf["hidden_act"] = "gelu"
    (tiny_copy / "config.json").write_text(json.dumps(conf))
    result = model.check_engine_architecture(cfg(model={"path": str(tiny_copy)}, rollout={"engine": "fast"}))
    assert result.status == "fail" and "rollout.engine=reference" in result.fix


def test_vision_language_checkpoints_pass_for_the_fast_engine(tmp_path):
    from ascent.models.tiny_vl import make_tiny_vl_checkpoint

    path = make_tiny_vl_checkpoint(tmp_path, family="qwen3_vl")
    result = model.check_engine_architecture(cfg(model={"path": str(path)}, rollout={"engine": "fast"}))
    assert result.status == "ok" and "qwen3_vl" in result.detail


def test_tensor_parallel_must_split_the_models_heads(tiny_copy):
    def check(tp):
        return model.check_engine_architecture(
            cfg(model={"path": str(tiny_copy)}, rollout={"engine": "fast", "tensor_parallel": tp})
        )

    assert check(2).status == "ok" and "split over 2 ranks" in check(2).detail
    bad = check(3)  # the tiny model has 4 heads
    assert bad.status == "fail" and "rollout.tensor_parallel=3" in bad.detail


def test_unknown_model_type_fails_for_the_fast_engine(tmp_path, tiny_dir):
    from transformers import GPT2Config

    GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=89).save_pretrained(tmp_path)
    result = model.check_engine_architecture(cfg(model={"path": str(tmp_path)}, rollout={"engine": "fast"}))
    assert result.status == "fail" and "gpt2" in result.detail


# ------------------------------------------------------------------------------------------ rendering
class RenderingEnv:
    """A dummy environment that renders (no built-in one does)."""

    needs_rendering = True


def test_rendering_env_without_egl_fails(monkeypatch):
    c = cfg(rollout={"source": {"name": "env", "env": f"{__name__}:RenderingEnv"}})
    names, error = model.rendering_envs(c)
    assert names == [f"{__name__}:RenderingEnv"] and error is None
    monkeypatch.setattr(system.ctypes.util, "find_library", lambda name: None)
    result = system.check_rendering(names)
    assert result.status == "fail" and "libegl1" in result.fix
    monkeypatch.setattr(
        system.ctypes.util, "find_library", lambda name: "libEGL.so.1" if name == "EGL" else None
    )
    assert system.check_rendering(names).status == "ok"
    assert model.rendering_envs(cfg(rollout={"source": {"name": "env", "env": "guess_number"}}))[0] == []


# ------------------------------------------------------------------------------------------ memory, all
def test_memory_fails_on_a_small_gpu_and_names_the_knob(monkeypatch, tiny_dir):
    monkeypatch.setattr(system, "gpu_facts", lambda: CPU)
    big = cfg(
        model={"path": str(tiny_dir)},
        train={"max_tokens_per_micro_batch": 200_000, "trajectories_per_update": 64},
        data={"max_prompt_tokens": 4000},
        rollout={"max_new_tokens": 4000},
    )
    report = run.run_checks(big, gpu_memory_gib=0.5)
    mem = report.results[-1]
    assert mem.name == "memory per GPU" and mem.status == "fail"
    assert "train.max_tokens_per_micro_batch" in mem.fix
    assert run.run_checks(big, gpu_memory_gib=80).results[-1].status == "ok"
    assert run.run_checks(big).results[-1].name == "host memory (CPU run)"  # no GPU, no --gpu-memory


def test_fast_engine_fraction_too_small_leaves_no_kv_cache(monkeypatch, tiny_dir):
    monkeypatch.setattr(system, "gpu_facts", lambda: H100)
    c = cfg(
        model={"path": str(tiny_dir), "dtype": "bf16"},
        rollout={"engine": "fast", "gpu_memory_fraction": 0.005},
    )
    mem = run.run_checks(c).results[-1]
    assert mem.status == "fail" and "rollout.gpu_memory_fraction" in mem.fix


def test_run_checks_exit_codes(monkeypatch, tiny_dir, rows_file):
    from ascent.doctor import report

    monkeypatch.setattr(system, "gpu_facts", lambda: CPU)
    monkeypatch.setattr(system, "host_memory", lambda: (64 * GIB, 32 * GIB))
    good = run.run_checks(cfg(model={"path": str(tiny_dir)}, data={"train_path": str(rows_file)}))
    assert report.exit_code(good.results) == 0, [r for r in good.results if r.status == "fail"]
    bad = run.run_checks(cfg(model={"path": str(tiny_dir)}, rollout={"engine": "fast"}))
    assert report.exit_code(bad.results) == 1  # fast engine without CUDA
    parsed = json.loads(report.to_json(bad.results))
    assert parsed["counts"]["fail"] >= 1 and {"name", "status", "detail", "fix"} <= set(parsed["checks"][0])


def test_existing_parent(tmp_path):
    assert system.existing_parent(tmp_path / "a" / "b") == tmp_path.resolve()


def test_an_awake_engine_warns_only_on_ray_where_nothing_overlaps_the_update():
    def check(k: int = 0, **cluster):
        cfg = RunConfig.model_validate({"cluster": cluster, "rollout": {"max_staleness": k}})
        return plan.check_awake_engine(cfg)

    assert check() is None  # (split placement with engine_sleeps=false is refused by the config itself)
    assert check(engine_sleeps=False, backend="ray", k=1).status == "ok"
    ray_k0 = check(engine_sleeps=False, backend="ray")
    assert ray_k0.status == "warn" and "rollout.max_staleness=1" in ray_k0.fix
    assert "max_staleness=0" in ray_k0.detail
    inline = check(engine_sleeps=False, k=1)  # one process: it keeps the cache and the graphs, no overlap
    assert inline.status == "ok" and "recapture" in inline.detail


def test_mps_says_whether_sharing_trainer_and_replicas_compute_at_once(monkeypatch, tmp_path):
    from ascent.cluster import mps

    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(mps, "DEFAULT_PIPE_DIR", str(tmp_path / "nvidia-mps"))  # no daemon on this node
    overlap = {"backend": "ray", "engine_sleeps": False, "gpus_per_worker": 1, "device": "cuda"}

    def check(k: int = 1, found: bool | None = True, **cluster):
        cfg = RunConfig.model_validate({"cluster": {**overlap, **cluster}, "rollout": {"max_staleness": k}})
        return plan.check_mps(cfg, control_found=found)

    assert check(k=0) is None and check(engine_sleeps=True) is None  # nothing overlaps: nothing to say
    assert check(device="cpu", gpus_per_worker=0) is None and check(backend="inline") is None
    off = check(mps="off")
    assert off.status == "warn" and "time slices" in off.detail and "cluster.mps=auto" in off.fix
    started = check()
    assert started.status == "ok" and "starts an MPS daemon" in started.detail
    missing = check(found=False)
    assert missing.status == "warn" and missing.detail.startswith("nvidia-cuda-mps-control not found")
    assert "cluster.mps=off" in missing.fix
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert check(found=None).status == "warn"  # looked up on PATH: not there
    (tmp_path / "bin" / "nvidia-cuda-mps-control").touch(mode=0o755)
    assert check(found=None).status == "ok"
    joined = check(found=False, address="10.0.0.1:6379")
    assert joined.status == "ok" and "joined cluster" in joined.detail
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/run/mps")
    node = check(found=False)
    assert node.status == "ok" and "/run/mps" in node.detail


def test_the_placement_plan_per_component_and_an_impossible_one_refused():
    split = {"backend": "ray", "placement": "split", "gpus_per_worker": 1, "num_rollout_workers": 2}
    run = cfg(cluster={**split, "reward_model_gpus": 2}, rollout={"engine": "fast", "tensor_parallel": 2})
    assert cluster.demand(run).gpus == 1 + 2 * 2  # a trainer rank, two replicas of two GPUs each
    text = cluster.check_placement(run, 8).detail
    assert "trainer 1 x 1 GPU" in text and "rollout 2 replica(s) x TP 2 x 1 GPU" in text and "5 GPUs" in text
    with pytest.raises(AscentError, match=r"this machine has 4 GPU\(s\)") as err:
        cluster.check_placement(
            cfg(cluster={**split, "trainer_gpus": 2}, rollout=run.rollout.model_dump()), 4
        )
    assert err.value.exit_code == 2
    assert cluster.check_placement(cfg(), 0).status == "ok"  # inline: one device


def test_per_component_gpus_need_split_placement_and_tensor_parallel_the_fast_engine():
    with pytest.raises(ValueError, match=r"cluster.trainer_gpus=2: only cluster.backend=ray with"):
        cfg(cluster={"backend": "ray", "trainer_gpus": 2})
    with pytest.raises(ValueError, match=r"cluster.rollout_gpus=1: .*tensor_parallel=2"):
        cfg(
            cluster={"backend": "ray", "placement": "split", "rollout_gpus": 1},
            rollout={"engine": "fast", "tensor_parallel": 2},
        )
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel=2: a colocated replica .*placement=split"):
        cfg(
            cluster={"backend": "ray", "gpus_per_worker": 1}, rollout={"engine": "fast", "tensor_parallel": 2}
        )
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel=2: only the fast engine"):
        cfg(rollout={"tensor_parallel": 2})


def test_sequence_parallel_check_names_the_heads_and_a_degree_that_splits_them():
    from ascent.doctor import memory as M

    shape = M.ModelShape(1000, 10, 28, 8, 2, heads=28, kv_heads=4, head_dim=1, tied=True)
    ray = {"backend": "ray", "num_trainer_workers": 8, "num_rollout_workers": 8}
    batch = {"rollout": {"prompts_per_step": 8, "samples_per_prompt": 2}, "cluster": ray}
    train = {"trajectories_per_update": 16}
    bad = plan.check_sequence_parallel(cfg(train={"sequence_parallel": 8, **train}, **batch), shape)
    assert bad is not None and bad.status == "fail" and "28 attention heads" in bad.detail
    assert "train.sequence_parallel=4" in bad.fix
    good = plan.check_sequence_parallel(cfg(train={"sequence_parallel": 4, **train}, **batch), shape)
    assert good is not None and good.status == "ok" and "2 group(s) of 4" in good.detail
    assert plan.check_sequence_parallel(cfg(), shape) is None


def test_tensor_parallel_splits_a_mixture_of_experts_by_its_expert_width(tmp_path):
    from transformers import Qwen3MoeConfig

    Qwen3MoeConfig(
        vocab_size=50,
        hidden_size=8,
        moe_intermediate_size=6,
        num_experts=4,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=2,
    ).save_pretrained(tmp_path)

    def check(tp):
        return model.check_engine_architecture(
            cfg(model={"path": str(tmp_path)}, rollout={"engine": "fast", "tensor_parallel": tp})
        )

    assert check(2).status == "ok" and "split over 2 ranks" in check(2).detail
    bad = check(4)  # 4 heads split, 6 expert features do not
    assert bad.status == "fail" and "moe_intermediate_size=6" in bad.detail and "experts' 6" in bad.fix
