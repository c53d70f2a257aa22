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
one process (a full disk is a `CheckpointWriteError` naming the checkpoint and the intact previous one). The
stage/commit/recover/prune mechanics are `ascent.trainer.checkpoint_commit`'s, shared with the run
checkpoints of `ascent.orchestrator.checkpointing`.
"""

from __future__ import annotations

import json
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ascent.trainer import checkpoint_commit as C
from ascent.trainer.checkpoint_commit import CHECKPOINTS, STATE_JSON, checkpoint_name

TRAINER_STATE = "trainer_state.pt"
STAGING = C.Staging(sep="-", pid=True)  # `.tmp-iter_X-<pid>`, `.old-iter_X-<pid>`: see checkpoint_commit
# what torch.load raises for a truncated, empty or scribbled-over file
_UNPICKLER = "WeightsUnpickler error:"  # where torch's own message ends and the cause begins
_LOAD_ERRORS = (OSError, EOFError, RuntimeError, ValueError, KeyError, IndexError, pickle.UnpicklingError)


def staging_dir(run_dir: str | Path, iteration: int) -> Path:
    """Create and return an empty staging directory for `iteration` beside the final checkpoints."""
    return C.stage(STAGING.tmp(Path(run_dir) / CHECKPOINTS / checkpoint_name(iteration)))


def commit_checkpoint(tmp: str | Path, iteration: int, keep_last: int | None = None) -> Path:
    """Rename the staging dir `tmp` to its final name (replacing an older one), prune; return the final
    path."""
    final = Path(tmp).parent / checkpoint_name(iteration)
    C.commit(Path(tmp), final, STAGING.old(final))
    if keep_last:
        prune_checkpoints(final.parent.parent, keep_last, keep=final)
    return final


def recover_checkpoints(run_dir: str | Path) -> list[Path]:
    """Repair saves killed between the two renames of `commit_checkpoint`: where `iter_X` is missing, its
    complete staging copy (state.json parses) or else its old copy is renamed back to it. Copies named by a
    process that is still running are its save in progress and left alone. -> repaired."""
    return C.recover(Path(run_dir) / CHECKPOINTS, STAGING)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (staging and other hidden directories are ignored; a save
    killed between its renames is repaired first, `recover_checkpoints`)."""
    recover_checkpoints(run_dir)
    return C.numbered(Path(run_dir) / CHECKPOINTS)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of `run_dir`, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def prune_checkpoints(run_dir: str | Path, keep_last: int, keep: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints (`keep`, the one just written, counts first and is
    never deleted) and any stale staging dirs; return what was deleted."""
    found = list_checkpoints(run_dir)
    return C.prune(Path(run_dir) / CHECKPOINTS, STAGING, found, keep_last, keep)


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
    """Read `trainer_state.pt` (tensors mapped to `map_location`). A missing or damaged file (torch.load's
    errors: a weights-only load runs no code of the file's, so any of them means the bytes are bad) is a
    `CheckpointReadError` naming the checkpoint and the previous complete one."""
    file = Path(directory) / TRAINER_STATE
    if not file.is_file():
        raise C.read_error(file, "missing")
    try:
        return cast(dict[str, Any], torch.load(file, map_location=map_location, weights_only=True))
    except _LOAD_ERRORS as err:
        raise C.read_error(file, f"not loadable ({_load_problem(err)})") from err


def _load_problem(err: BaseException) -> str:
    """torch.load's error in one short line. A weights-only unpickling error opens with advice to load with
    weights_only=False, which would not help a damaged file: the unpickler's own words are kept instead."""
    text = str(err).split(_UNPICKLER, 1)[-1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0][:200]}" if lines else type(err).__name__


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

    def write(tmp: Path) -> None:
        if write_model is not None:
            write_model(tmp)
        elif model is not None:
            model.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if not (tmp / TRAINER_STATE).exists():  # a `write_model` like PolicyWorker.save writes its own
            write_trainer_state(tmp, optimizer_state=optimizer_state, scheduler_state=scheduler_state)
        write_state_json(tmp, iteration, extra)

    tmp = staging_dir(run_dir, iteration)
    try:
        C.write_staged(tmp, write)  # a failure deletes `tmp` and re-raises
    except Exception as err:
        why = C.write_failure(err)
        if why is None:  # not the machine's: a bug, with its traceback
            raise
        final = tmp.parent / checkpoint_name(iteration)
        raise C.write_error(final, latest_checkpoint(run_dir), why) from err
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
