"""One publication kept: the judge engine of `reward.judge.model=policy@N`, which holds the run's policy as
of version N and is never updated after.

`PinnedPublisher` wraps the run's `Publisher`: every publication goes to the rollout replicas as before, and
the one of version N also goes to the judge's worker group (trainer rank 0's weights on the CPU, forwarded
as `publish_forwarded` forwards them: the controller never holds them), which applies them and writes them
to `<run_dir>/judge/v<N>/model.safetensors` (`write_pinned`), outside checkpoint rotation. Before version N
exists the judge holds what it was built from (model.path: the initial weights). A resumed run whose first
publication is past N never sees version N again: the judge then loads the pinned copy (`read_pinned`), so
it judges with the weights the uninterrupted run judged with.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ascent.cluster.base import WorkerGroup
from ascent.errors import AscentError
from ascent.transport.publish import Publisher, TrainerEnd, check_held

WEIGHTS_FILE = "model.safetensors"
log = logging.getLogger("ascent")


def pinned_dir(run_dir: str | Path, version: int) -> Path:
    """Where version `version` of a run's policy is kept for its judge: `<run_dir>/judge/v<version>`."""
    return Path(run_dir) / "judge" / f"v{version}"


def write_pinned(named: Mapping[str, torch.Tensor], directory: str | Path, version: int) -> None:
    """Write `named` (Hugging Face names) as `directory/model.safetensors`, `version` in its metadata; the
    directory appears whole or not at all (written next to it, then renamed). Tensors that share storage
    (tied embeddings) are copied apart: safetensors refuses shared ones."""
    out = Path(directory)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        tensors[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"version": str(version)})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def read_pinned(directory: str | Path, version: int) -> dict[str, torch.Tensor]:
    """The weights `write_pinned` kept in `directory` (on the CPU); a file of another version is an error."""
    path = Path(directory) / WEIGHTS_FILE
    with safe_open(str(path), framework="pt") as f:
        held = (f.metadata() or {}).get("version")
        if held != str(version):
            raise AscentError(
                f"{path} holds policy version {held}, not {version}: reward.judge.model=policy@{version} "
                "needs the copy this run wrote; restore it, or start a fresh run."
            )
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open is no mapping


@dataclass(frozen=True)
class JudgeEnd:
    """The judge's worker group and the methods of its worker class a pinned publication calls."""

    group: WorkerGroup[Any]
    pin: Callable[..., int]  # (named tensors, version, directory) -> version held, after writing the copy
    load: Callable[..., int]  # (directory, version) -> version held, read from the copy


class PinnedPublisher:
    """A `Publisher` that also hands policy `version` (and only it) to the judge (see the module)."""

    def __init__(
        self, inner: Publisher, trainer: TrainerEnd, judge: JudgeEnd, version: int, directory: Path
    ) -> None:
        self.inner, self.trainer, self.judge = inner, trainer, judge
        self.version, self.directory = version, directory
        self.name, self.in_process = inner.name, inner.in_process
        self.held = False  # whether the judge holds `version` yet

    def publish(self, version: int) -> None:
        self.inner.publish(version)
        if self.held or version < self.version:
            return
        if version == self.version:
            self._pin()
        else:  # a resumed run starting past the pinned version: the copy the first run wrote
            self._load(version)
        self.held = True

    def _pin(self) -> None:
        """Trainer rank 0's weights (on the CPU) forwarded to the judge, which applies and writes them."""
        trainer, judge = self.trainer, self.judge
        pending = trainer.group.call_async(trainer.named_weights, to_cpu=True)
        try:
            held = judge.group.call_async(
                judge.pin, pending.forward(0), self.version, str(self.directory)
            ).get()
        except Exception:
            pending.get()  # the trainer's own error, when it failed first
            raise
        pending.others(0)
        check_held(self.version, held)

    def _load(self, current: int) -> None:
        path = self.directory / WEIGHTS_FILE
        if not path.is_file():
            raise AscentError(
                f"reward.judge.model=policy@{self.version}: the run resumes at policy version {current}, past "
                f"{self.version}, and the judge's copy of version {self.version}, {path}, is missing; restore "
                "it (it is written when that version is published), or start a fresh run (a resumed run "
                "judges with the weights the uninterrupted run judged with)."
            )
        check_held(self.version, self.judge.group.call(self.judge.load, str(self.directory), self.version))
        log.info(
            "reward.judge: policy version %d loaded from %s (the run resumes past it)", self.version, path
        )

    def describe(self) -> str:
        return (
            f"{self.inner.describe()}; the judge gets policy version {self.version} only ({self.directory})"
        )
