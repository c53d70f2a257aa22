"""Run every doctor check of a config, in the order a user fixes things: machine, cluster, trackers, data,
plug-ins, model (and the images it is shown), disk, memory (per GPU, or this machine's RAM for a run on the CPU).
`run_checks` returns the results and the memory estimate (for the table and `--json`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ascent.config.schema import RunConfig
from ascent.doctor import cluster, data, images, model, plan, plugins, system, tracking
from ascent.doctor.memory import GIB, Estimate, MemoryInputs, ModelShape
from ascent.doctor.report import CheckResult, skipped


@dataclass
class DoctorReport:
    results: list[CheckResult] = field(default_factory=list)
    inputs: MemoryInputs | None = None
    estimate: Estimate | None = None


def gpu_target(facts: system.GpuFacts, gpu_memory_gib: float | None) -> tuple[int, str]:
    """(bytes of the GPU to check against, its name): --gpu-memory wins, else the smallest visible GPU."""
    if gpu_memory_gib is not None:
        return int(gpu_memory_gib * GIB), f"--gpu-memory {gpu_memory_gib:g} GiB"
    if facts.count:
        i = facts.total_bytes.index(min(facts.total_bytes))
        return facts.total_bytes[i], f"{facts.names[i]} ({facts.total_bytes[i] / GIB:.1f} GiB)"
    return 0, "no GPU"


def machine_checks(cfg: RunConfig, facts: system.GpuFacts) -> list[CheckResult]:
    gpu = plan.on_gpu(cfg, facts.count)
    needs_gpu = cfg.cluster.device == "cuda" or cfg.rollout.engine == "fast"
    total, here = plan.gpus_needed(cfg)
    return [
        system.check_python(),
        system.check_torch(facts, system.torch_requirement()),
        system.check_cuda(facts, needs_gpu),
        *system.check_capability(
            facts, cfg.model.dtype, cfg.rollout.engine == "fast", plan.trainer_attention(cfg, gpu)
        ),
        *system.check_fp8(facts, cfg.rollout.quantization),
        system.check_nccl(facts, total, here),
    ]


def ray_default_temp_dir(environ: Mapping[str, str]) -> str:
    """Where a local Ray cluster keeps its session and spill files when cluster.ray_temp_dir is unset: Ray's
    own rule, $RAY_TMPDIR/ray, else $TMPDIR/ray (Linux), else /tmp/ray."""
    base = environ.get("RAY_TMPDIR") or (environ.get("TMPDIR") if sys.platform.startswith("linux") else None)
    return str(Path(base or "/tmp") / "ray")


def disk_checks(cfg: RunConfig, shape: object) -> list[CheckResult]:
    if not isinstance(shape, ModelShape):
        return [skipped("disk", "the model's size is unknown (see the model check)")]
    out = [
        system.check_disk(
            "disk: run_dir",
            cfg.run_dir,
            plan.run_dir_bytes(cfg, shape),
            f"{cfg.checkpoint.keep_last} checkpoints kept + 1 being written + final, "
            "and the experience store",
            "run_dir",
        )
    ]
    if cfg.cluster.backend == "ray" and not cfg.cluster.address:
        out.append(
            system.check_disk(
                "disk: Ray temp/spill",
                cfg.cluster.ray_temp_dir or ray_default_temp_dir(os.environ),
                plan.ray_temp_bytes(cfg, shape),
                "session files and spilled weights",
                "cluster.ray_temp_dir",
            )
        )
    else:
        out.append(skipped("disk: Ray temp/spill", "no local Ray cluster is started"))
    return out


def run_checks(
    cfg: RunConfig, *, gpu_memory_gib: float | None = None, ports: list[int] | None = None
) -> DoctorReport:
    facts = system.gpu_facts()
    placement = cluster.check_placement(cfg, facts.count)  # raises (exit 2) for a plan that cannot fit
    report = DoctorReport(machine_checks(cfg, facts))
    report.results.append(placement)
    report.results += cluster.check_ray(cfg, facts.count)
    report.results.append(system.check_ports(list(ports or [])))
    report.results += tracking.check_trackers(cfg.tracking)
    report.results += data.check_data(cfg)
    report.results.append(plugins.check_plugins(cfg))
    model_result, shape = model.check_model(cfg)
    report.results += [model_result, model.check_tokenizer(cfg), model.check_engine_architecture(cfg)]
    report.results.append(images.check_images(cfg))
    renderers, env_error = model.rendering_envs(cfg)
    report.results += [env_error] if env_error else []
    report.results.append(system.check_rendering(renderers))
    simulators = model.simulator_envs(cfg)
    rendering = system.check_simulator_rendering(simulators)
    report.results.append(rendering)
    backend = rendering.data.get("backend")
    report.results.append(cluster.check_simulator_placement(cfg, simulators, backend, facts.count))
    report.results += disk_checks(cfg, shape)
    checks = (
        plan.check_micro_batch(cfg),
        plan.check_awake_engine(cfg),
        plan.check_mps(cfg),
        plan.check_sequence_parallel(cfg, shape),
    )
    report.results += [r for r in checks if r]
    if shape is None:
        report.results.append(skipped("memory per GPU", "the model's shape is unknown (see the model check)"))
        return report
    gpu_bytes, target = gpu_target(facts, gpu_memory_gib)
    if cfg.cluster.device == "cpu":
        gpu_bytes = 0  # a CPU run: no GPU size applies
    gpus = max(facts.count, 1 if gpu_bytes else 0)
    report.inputs, report.estimate = plan.run_estimate(cfg, shape, gpu_bytes, gpus)
    if plan.on_gpu(cfg, gpus) or gpu_memory_gib is not None:
        hints = (plan.check_recompute(report.inputs, target), plan.check_kept_logits(report.inputs, target))
        report.results += [h for h in hints if h]
        report.results.append(plan.check_memory(report.inputs, report.estimate, target))  # last: the verdict
    if not plan.on_gpu(cfg, gpus):  # the workers run on the CPU: the estimate is of this machine's RAM
        total, available = system.host_memory()
        report.results.append(plan.check_host_memory(cfg, report.inputs, report.estimate, total, available))
    return report
