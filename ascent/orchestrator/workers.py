"""The worker classes the controller places in worker groups: rollout, trainer, critic and reward model.

Each is a plain class built from its spec (a frozen, flat dataclass: `EngineSpec`, `TrainerSpec`,
`CriticSpec`, `RewardModelSpec`, made by `ascent.orchestrator.specs`; no config section crosses into a
worker), so the inline and the Ray backend construct them the same way. Logs: under Ray the worker group
sends each actor's log to `<run_dir>/logs/<name>_<rank>.log`; inline, workers share the controller's process
and its `logs/controller.log`. Trainers with several ranks join the torch.distributed group described by the
RANK/WORLD_SIZE variables the worker group sets.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from ascent.cluster.base import find_free_port
from ascent.messages import Generation, GenerationRequest, Rollout, TrainSample
from ascent.models.loading import load_tokenizer, resolve_device
from ascent.rollout.constraints import LLGuidanceConstraints
from ascent.rollout.specs import EngineSpec
from ascent.trainer.reward_model import RewardModel, RewardModelSpec
from ascent.trainer.settings import CriticSpec, TrainerSpec
from ascent.transport.pinned import read_pinned, write_pinned
from ascent.transport.select import receiver_link, sender_link
from ascent.transport.weights import Rendezvous, node_address

log = logging.getLogger("ascent.workers")


def init_distributed(device: torch.device) -> int:
    """Join the process group described by the worker group's env vars; return the world size."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend)
    return world


def _seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class RolloutWorker:
    """Owns one rollout engine replica: generation, weight updates, sleep/wake."""

    def __init__(self, spec: EngineSpec, run_dir: str | None = None) -> None:
        from ascent.rollout import build_engine  # deferred: the engines load only where a replica is built

        kwargs = spec.builder_kwargs()
        kwargs["device"] = resolve_device(spec.device)
        tok = load_tokenizer(spec.tokenizer_path, spec.trust_remote_code)
        kwargs.setdefault("eos_token_ids", [tok.eos_token_id])
        kwargs.setdefault("pad_token_id", tok.pad_token_id)
        kwargs.setdefault("decode", lambda ids: tok.decode(ids, skip_special_tokens=False))
        self.engine = build_engine(spec.name, **kwargs)
        if hasattr(self.engine, "constraints") and self.engine.constraints is None:
            self.engine.constraints = LLGuidanceConstraints(tok)  # rollout.grammar's requests (built lazily)
        self.version = 0  # the policy version of the weights the engine holds (set by every publication)
        self._last_end: float | None = None  # when the previous generate call ended (engine idle time)
        self.link: Any = None  # the weight transport's receiving link, once joined

    def generate(self, requests: list[GenerationRequest]) -> Rollout:
        """Sample every request; each token is stamped with the version of the weights that sampled it (a
        publication sent alongside may change them between two decode steps of this call)."""
        start, version = time.perf_counter(), self.version
        idle = 0.0 if self._last_end is None else start - self._last_end
        generations = [[self._stamped(g) for g in row] for row in self.engine.generate(requests)]
        self._last_end = time.perf_counter()
        return Rollout(generations, version, idle)

    def _stamped(self, gen: Generation) -> Generation:
        if gen.token_versions:  # an engine told each publication's version stamps every token itself
            return gen
        return replace(gen, token_versions=[self.version] * len(gen.token_ids))

    def update_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> int:
        """Copy in the weights of policy `version`; returns the version now held, once they are in place
        (the copies are asynchronous on a GPU, so without the sync `time/publish` would measure only their
        launch). Sent in order (`call_async`), it runs after the generate calls queued before it; sent
        alongside (`call_alongside_async`, rollout.swap_mid_generation), during the one in progress, between
        two of its decode steps (the fast engine's `publication`)."""
        with self._publication(version):
            self.engine.update_weights(named_tensors.items())
        return self.version

    @contextlib.contextmanager
    def _publication(self, version: int) -> Iterator[None]:
        """The engine's own publication block where it has one (it then stamps tokens with `version`)."""
        publication = getattr(self.engine, "publication", None)
        with publication(version) if publication is not None else contextlib.nullcontext():
            yield
            device = getattr(self.engine, "device", None)
            if isinstance(device, torch.device) and device.type == "cuda":
                torch.cuda.synchronize(device)
        self.version = version

    def join_weight_transport(self, rv: Rendezvous) -> None:
        """Form this replica's `Receiver` of `rv`'s link transport as replica RANK (`ascent.transport`)."""
        device = getattr(self.engine, "device", torch.device("cpu"))
        self.link = receiver_link(rv, int(os.environ.get("RANK", "0")), device)

    def receive_weights(self, version: int) -> int:
        """Take policy `version` bucket by bucket from the trainer over the joined link; returns the version
        now held (as `update_weights`, in order or alongside)."""
        with self._publication(version):
            self.link.receive(lambda part: self.engine.update_weights(part), version)
        return self.version

    def pin_weights(self, named_tensors: dict[str, torch.Tensor], version: int, directory: str) -> int:
        """A judge's engine (`reward.judge.model=policy@N`) takes policy `version`, as `update_weights`
        does, and keeps a copy in `directory` for a resumed run (`ascent.transport.pinned`)."""
        held = self.update_weights(named_tensors, version)
        write_pinned(named_tensors, directory, version)
        return held

    def load_pinned(self, directory: str, version: int) -> int:
        """A judge's engine takes policy `version` from the copy `pin_weights` wrote in `directory`."""
        weights = read_pinned(directory, version)
        with self._publication(version):
            self.engine.update_weights(weights.items())
        return self.version

    def sleep(self, release_weights: bool = False) -> None:
        """Free the engine's cache (and its weights with `release_weights`: publish a full set before
        wake)."""
        if release_weights:
            self.engine.sleep(release_weights=True)
        else:
            self.engine.sleep()  # engines written for the plain protocol still work

    def wake(self) -> None:
        self.engine.wake()

    def kv_cache_tokens(self) -> int | None:
        """Tokens the engine's KV cache holds now (the fast engine sizes it at every wake to what is free:
        rollout/kv_tokens); None for an engine without a paged cache."""
        tokens = getattr(self.engine, "kv_cache_tokens", None)
        return tokens if isinstance(tokens, int) else None


class TrainerWorker:
    """One data-parallel rank of the policy trainer (wraps `ascent.trainer.PolicyWorker`)."""

    def __init__(self, spec: TrainerSpec, seed: int, run_dir: str | None = None) -> None:
        # deferred: the training stack (transformers, peft, FSDP) loads only in a trainer rank's process
        from ascent.models.varlen import enable_for_training
        from ascent.trainer.policy import PolicyWorker  # deferred: the same stack

        rank = int(os.environ.get("RANK", "0"))
        device = resolve_device(spec.device)
        self.world_size = init_distributed(device)
        _seed_everything(seed + rank)
        self.policy = PolicyWorker.from_spec(spec, device=device)
        self.link: Any = None  # the weight transport's sending link (rank 0, or every rank for cuda_ipc)
        # packed micro-batches through flash varlen kernels instead of a dense [N, N] mask (CUDA, bf16/fp16);
        # sequence parallelism has switched the models to its own attention (varlen inside) already
        if spec.sequence_parallel == 1:
            enable_for_training(
                self.policy.model, self.policy.device, self.policy.compute_dtype, spec.attention
            )

    def compute_logprobs(
        self, samples: list[TrainSample], temperature: float, which: str
    ) -> list[list[float]]:
        return self.policy.compute_logprobs(samples, temperature=temperature, which=which)

    def compute_logprobs_and_sum_pi_squared(
        self, samples: list[TrainSample], temperature: float
    ) -> tuple[list[list[float]], list[list[float]]]:
        return self.policy.compute_logprobs_and_sum_pi_squared(samples, temperature=temperature)

    def update(
        self, samples: list[TrainSample], total_tokens: float, total_seqs: float, step: bool = True
    ) -> dict[str, float]:
        return self.policy.update(samples, total_tokens=total_tokens, total_seqs=total_seqs, step=step)

    def named_weights(self, to_cpu: bool = True) -> dict[str, torch.Tensor]:
        """The policy's weights in HF naming, from rank 0 (other ranks return {}).

        Every rank is called: with FSDP the gather is a collective all ranks join. Tensors stay on the
        device when the engine lives in this process (`to_cpu=False`).
        """
        rank = int(os.environ.get("RANK", "0"))
        weights = self.policy.named_weights()
        if rank != 0:
            if getattr(self.policy, "sharded", False):
                for _ in weights:  # take part in each bucket's all-gather
                    pass
            return {}
        if to_cpu:
            return {name: t.detach().to("cpu") for name, t in weights}
        return {name: t.detach() for name, t in weights}

    def weight_transport_address(self) -> tuple[str, int]:
        """(node IP, free port) where this rank would host the publication's rendezvous store."""
        return node_address(), find_free_port()

    def join_weight_transport(self, rv: Rendezvous) -> None:
        """Form this rank's `Sender` of `rv`'s link transport (rank 0 hosts the store; `ascent.transport`)."""
        self.link = sender_link(rv, int(os.environ.get("RANK", "0")), self.policy.device)

    def send_weights(self, version: int) -> int:
        """Publish the current weights as `version` over the joined link; returns the bytes sent by this rank.

        Every rank is called (FSDP gathers each bucket with all ranks); a rank without a link only takes
        part."""
        weights = self.policy.named_weights()
        if self.link is None:
            for _ in weights:
                pass
            return 0
        return self.link.send(weights, version)

    def release_cached_memory(self) -> int:
        """Hand the allocator's cached, unused GPU blocks back to the driver; returns the bytes released.

        Colocated on Ray the engine wakes in another process on this GPU: blocks the update left cached here
        would stay reserved next to its weights and KV cache (in one process the engine reuses them)."""
        return release_cached_memory(self.policy.device)

    def save(self, path: str, optimizer: bool = True, hf_weights: bool = True) -> None:
        self.policy.save(path, optimizer, hf_weights)

    def load(self, path: str) -> None:
        self.policy.load(path)


class CriticWorkerActor:
    """One data-parallel rank of the critic (wraps `ascent.trainer.critic.CriticWorker`)."""

    def __init__(self, spec: CriticSpec, seed: int, run_dir: str | None = None) -> None:
        from ascent.trainer.critic import CriticWorker  # deferred: loads only in a critic rank's process

        device = resolve_device(spec.device)
        init_distributed(device)
        _seed_everything(seed + 7 + int(os.environ.get("RANK", "0")))
        self.critic = CriticWorker.from_spec(spec, device=device)

    def compute_values(self, samples: list[TrainSample]) -> list[list[float]]:
        return self.critic.compute_values(samples)

    def update(self, samples: list[TrainSample], total_tokens: float, total_seqs: float) -> dict[str, float]:
        return self.critic.update(samples, total_tokens=total_tokens, total_seqs=total_seqs)

    def release_cached_memory(self) -> int:
        """As `TrainerWorker.release_cached_memory`, for the critic's rank."""
        return release_cached_memory(self.critic.device)

    def save(self, path: str, optimizer: bool = True, hf_weights: bool = True) -> None:
        self.critic.save(path, optimizer, hf_weights)

    def load(self, path: str) -> None:
        self.critic.load(path)


class RewardModelWorker:
    """Holds a frozen sequence-classification reward model (`ascent.trainer.reward_model.RewardModel`)."""

    def __init__(self, spec: RewardModelSpec, run_dir: str | None = None) -> None:
        self.model = RewardModel(spec)

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """(prompt, response) texts -> one reward each, in order (packed forwards, no gradients)."""
        return self.model.score(pairs)


def release_cached_memory(device: torch.device) -> int:
    """torch.cuda.empty_cache on `device`; the reserved bytes it gave back (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    before = torch.cuda.memory_reserved(device)
    with torch.cuda.device(device):
        torch.cuda.empty_cache()
    return before - torch.cuda.memory_reserved(device)
