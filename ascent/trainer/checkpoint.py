"""Atomic, prunable run checkpoints (design: "trainer/ ... checkpoint").

Layout of one checkpoint, `<run_dir>/checkpoints/iter_000005/`:

    config.json, model.safetensors, ...   Hugging Face weights (loadable by `from_pretrained`), tokenizer too
    adapter/                              LoRA adapter (peft format), only for LoRA runs
    trainer_state.pt                      optimizer, scheduler, RNG states (python, numpy, torch, cuda)
    model_shards/, optimizer_shards/      sharded runs (train.sharding=fsdp): weights and AdamW as
                                          torch.distributed.checkpoint shards, loadable on any number of ranks
    rng_rank00000.pt, ...                 sharded runs: each rank's RNG states
    state.json                            iteration, data position, config, metrics (the `extra` dict)

Everything is written into a hidden staging directory `.tmp-iter_000005-<pid>` next to the final one and
renamed into place at the end (`os.replace` on the same filesystem), so a crash never leaves a half
checkpoint under a name `latest_checkpoint` would pick. Multi-process runs use the two halves directly:
`staging_dir` -> every worker writes its part -> `commit_checkpoint`; `save_checkpoint` does all three in
one process.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

CHECKPOINTS = "checkpoints"
TRAINER_STATE = "trainer_state.pt"
STATE_JSON = "state.json"
_NAME = re.compile(r"^iter_(\d+)$")
_COPY = re.compile(r"^\.(?:tmp|old)-(iter_\d+)-(\d+)$")  # staging / replaced copies of `commit_checkpoint`


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def staging_dir(run_dir: str | Path, iteration: int) -> Path:
    """Create and return an empty staging directory for `iteration` beside the final checkpoints."""
    parent = Path(run_dir) / CHECKPOINTS
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".tmp-{checkpoint_name(iteration)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def commit_checkpoint(tmp: str | Path, iteration: int, keep_last: int | None = None) -> Path:
    """Rename the staging dir `tmp` to its final name (replacing an older one), prune; return the final path."""
    tmp = Path(tmp)
    final = tmp.parent / checkpoint_name(iteration)
    old = tmp.parent / f".old-{final.name}-{os.getpid()}"
    if final.exists():  # saved again: the old copy stays whole until the new one is in place
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    if keep_last:
        prune_checkpoints(tmp.parent.parent, keep_last, keep=final)
    return final


def recover_checkpoints(run_dir: str | Path) -> list[Path]:
    """Repair saves killed between the two renames of `commit_checkpoint`: where `iter_X` is missing, its
    complete staging copy (state.json parses) or else its old copy is renamed back to it. Copies named by a
    process that is still running are its save in progress and left alone. -> repaired."""
    parent = Path(run_dir) / CHECKPOINTS
    if not parent.is_dir():
        return []
    copies: dict[str, list[Path]] = {}
    for p in sorted(parent.iterdir(), key=lambda p: not p.name.startswith(".tmp-")):  # new copies first
        m = _COPY.match(p.name)
        if m and p.is_dir() and not _running(int(m.group(2))) and _complete(p):
            copies.setdefault(m.group(1), []).append(p)
    repaired = []
    for name, found in copies.items():
        if not (parent / name).exists():
            os.replace(found[0], parent / name)
            repaired.append(parent / name)
    return repaired


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # running, as another user
        return True
    return True


def _complete(path: Path) -> bool:
    try:
        return isinstance(json.loads((path / STATE_JSON).read_text()), dict)
    except (OSError, ValueError):
        return False


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (staging and other hidden directories are ignored; a save
    killed between its renames is repaired first, `recover_checkpoints`)."""
    parent = Path(run_dir) / CHECKPOINTS
    if not parent.is_dir():
        return []
    recover_checkpoints(run_dir)
    found = [(int(m.group(1)), p) for p in parent.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of `run_dir`, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def prune_checkpoints(run_dir: str | Path, keep_last: int, keep: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints (`keep`, the one just written, counts first and is
    never deleted) and any stale staging dirs; return what was deleted."""
    found = [p for p in list_checkpoints(run_dir) if p != keep]
    doomed = found[: max(len(found) - keep_last + (keep is not None), 0)]
    parent = Path(run_dir) / CHECKPOINTS
    doomed += [p for p in parent.iterdir() if p.is_dir() and p.name.startswith((".tmp-", ".old-"))]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def rng_state() -> dict[str, Any]:
    """RNG states of python, numpy, torch (CPU) and every CUDA device, in a `torch.load`-safe form."""
    # the global RandomState is MT19937, whose legacy (default) state is this tuple; numpy's stubs say a dict
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    return {
        "python": random.getstate(),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured (CUDA states only when devices are present)."""
    random.setstate(_as_tuple(state["python"]))
    name, key, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x


def write_trainer_state(
    directory: str | Path, *, optimizer_state: dict | None, scheduler_state: dict | None, **more: Any
) -> None:
    """Write `trainer_state.pt`: optimizer and scheduler state dicts, RNG states, and any `more` entries."""
    state = {"optimizer": optimizer_state, "scheduler": scheduler_state, "rng": rng_state(), **more}
    torch.save(state, Path(directory) / TRAINER_STATE)


def read_trainer_state(directory: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read `trainer_state.pt` (tensors mapped to `map_location`)."""
    return torch.load(Path(directory) / TRAINER_STATE, map_location=map_location, weights_only=True)


def save_checkpoint(
    run_dir: str | Path,
    iteration: int,
    *,
    model: Any = None,
    write_model: Callable[[Path], None] | None = None,
    tokenizer: Any = None,
    optimizer_state: dict | None = None,
    scheduler_state: dict | None = None,
    extra: dict[str, Any] | None = None,
    keep_last: int | None = None,
) -> Path:
    """Write checkpoint `iteration` of `run_dir` atomically, prune to `keep_last`; return its path.

    Weights come from `model.save_pretrained(dir)`, or from `write_model(dir)` when given (e.g.
    `PolicyWorker.save`, which also writes trainer_state.pt with its optimizer; otherwise trainer_state.pt
    holds `optimizer_state`, `scheduler_state` and the RNG states). `extra` (JSON-serialisable: data position,
    config dict, metrics) goes to state.json with the iteration.
    """
    tmp = staging_dir(run_dir, iteration)
    try:
        if write_model is not None:
            write_model(tmp)
        elif model is not None:
            model.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if not (tmp / TRAINER_STATE).exists():  # a `write_model` like PolicyWorker.save writes its own
            write_trainer_state(tmp, optimizer_state=optimizer_state, scheduler_state=scheduler_state)
        write_state_json(tmp, iteration, extra)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return commit_checkpoint(tmp, iteration, keep_last)


def write_state_json(directory: str | Path, iteration: int, extra: dict[str, Any] | None = None) -> None:
    """Write `state.json` = {"iteration": iteration, **extra}."""
    text = json.dumps({"iteration": iteration, **(extra or {})}, indent=2, sort_keys=True, default=str)
    (Path(directory) / STATE_JSON).write_text(text)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint's state.json and trainer_state.pt: {"path", "state", "trainer_state"}.

    Weights are not loaded here: pass `path` to `load_model` / `PolicyWorker.load`.
    """
    p = Path(path)
    if not (p / STATE_JSON).is_file():
        raise FileNotFoundError(f"{str(p)!r} is not a complete checkpoint (no {STATE_JSON}).")
    state = json.loads((p / STATE_JSON).read_text())
    trainer = read_trainer_state(p, map_location) if (p / TRAINER_STATE).is_file() else {}
    return {"path": p, "state": state, "trainer_state": trainer}
