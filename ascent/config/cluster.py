"""The `cluster` section: backend (inline or Ray), worker counts, GPU placement per component and weight
transport (split out of `ascent.config.schema`, which re-exports it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ascent.config.section import Section


class ClusterConfig(Section):
    backend: Literal["inline", "ray"] = Field("inline", description="Run workers inline or as Ray actors.")
    address: str | None = Field(
        None,
        description="Ray cluster to join: `auto` (the one started on this node, e.g. by the Slurm example) "
        "or `host:port` of its head; null starts a local one.",
    )
    num_cpus: int | None = Field(
        None, gt=0, description="CPUs of the local Ray cluster ascent starts (null: all of this machine's)."
    )
    ray_temp_dir: str | None = Field(
        None,
        description="Ray's session and object-spill directory for the local cluster ascent starts (null: "
        "/tmp/ray); put it on a large local disk on clusters with a small /tmp.",
    )
    num_trainer_workers: int = Field(
        1,
        gt=0,
        description="Trainer processes (data parallel, FSDP on GPUs). A --resume may change it: gradients "
        "are summed over ranks, and checkpoints load on any number of ranks.",
    )
    num_rollout_workers: int = Field(1, gt=0, description="Rollout engine replicas.")
    gpus_per_worker: float = Field(
        0.0,
        ge=0,
        description="GPUs each worker asks for (0 on CPU); with placement=split, the default of trainer_gpus, "
        "rollout_gpus (times rollout.tensor_parallel) and reward_model_gpus.",
    )
    trainer_gpus: float | None = Field(
        None,
        ge=0,
        description="placement=split on Ray: GPUs of each trainer (and critic) rank (null: gpus_per_worker).",
    )
    rollout_gpus: float | None = Field(
        None,
        ge=0,
        description="placement=split on Ray: GPUs of each rollout engine replica, at least "
        "rollout.tensor_parallel (null: gpus_per_worker x rollout.tensor_parallel).",
    )
    reward_model_gpus: float | None = Field(
        None,
        ge=0,
        description="placement=split on Ray: GPUs of each reward-model rank and of a judge's own engine "
        "(null: gpus_per_worker).",
    )
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs each Ray actor asks for.")
    placement: Literal["colocated", "split"] = Field(
        "colocated",
        description="`colocated`: trainer rank i and rollout replica i share GPU bundle i (gpus_per_worker "
        "GPUs) and take turns, the engine asleep during the update (Ray: one placement group; "
        "num_rollout_workers must equal num_trainer_workers). `split`: every worker gets its own "
        "gpus_per_worker GPUs, so rollout can run ahead of training (rollout.max_staleness).",
    )
    engine_sleeps: bool = Field(
        True,
        description="Colocated placement: the fast engine frees its KV cache and weights through the "
        "trainer's logprob passes and update (true). false keeps it awake, its KV cache and CUDA graphs "
        "kept (no reallocation or recapture per iteration); on Ray with rollout.max_staleness >= 1 it then "
        "generates the next iterations while the trainer updates on the same GPU (both resident at once: "
        "`ascent doctor` sums them), and publications land between decode steps "
        "(rollout.swap_mid_generation).",
    )
    mps: Literal["auto", "on", "off"] = Field(
        "auto",
        description="CUDA MPS on Ray GPUs: without it, processes sharing a GPU run their kernels in turns "
        "(time slices). `auto`: where trainer ranks and replicas compute at once on the same GPUs (colocated, "
        "engine_sleeps=false, rollout.max_staleness >= 1) on a local Ray cluster, ascent starts an MPS daemon "
        "of its own for the run (private pipe directory, stopped at the end), or uses the node's; without "
        "`nvidia-cuda-mps-control` it logs why and runs time-sliced. `on`: for every Ray GPU run, and an error "
        "if MPS cannot start. `off`: never. A joined cluster (cluster.address) runs its nodes' own MPS.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Device of the workers.")
    worker_timeout_s: float = Field(
        1800.0, gt=0, description="Fail a worker call that takes longer than this."
    )
    weight_transport: Literal["auto", "broadcast", "cuda_ipc", "object_store"] = Field(
        "auto",
        description="How a publication moves the trainer's weights to the replicas on Ray (inline: shared "
        "tensors). `broadcast`: a process group of trainer rank 0 and the replicas (NCCL on GPUs, gloo on "
        "CPU), bucket by bucket; `cuda_ipc`: trainer rank i hands replica i its GPU memory (colocated, one "
        "node); `object_store`: through Ray's object store (slowest; the fallback). `auto`: cuda_ipc when "
        "colocated on GPUs, else broadcast.",
    )
    weight_bucket_mb: int = Field(
        512, gt=0, description="Size of one weight bucket of a publication (the most any side holds extra)."
    )
    weight_sync_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Fail a weight publication step (join, a bucket) that waits longer than this.",
    )

    @property
    def generates_alongside(self) -> bool:
        """Whether the replicas can sample while the trainer computes: on Ray, on GPUs (or CPUs) of their
        own (split), or colocated with the engine kept awake (`engine_sleeps=false`)."""
        return self.backend == "ray" and (self.placement == "split" or not self.engine_sleeps)
