"""Run checkpoints: the trainer's weights and optimizer plus the controller's state, written atomically.

Layout: `<run_dir>/checkpoints/iter_000005/` holds the HF weights (loadable by `from_pretrained`), the
trainer state of each rank, and `state.json` (iteration, data position, config). Everything is written into a
temporary sibling directory and renamed at the end, so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("ascent")

PREFIX = "iter_"


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary directories are ignored)."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    done = [
        p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.json").exists()
    ]
    return sorted(done, key=lambda p: int(p.name[len(PREFIX) :]))


def commit(
    run_dir: str | Path,
    iteration: int,
    writers: list[Callable[[str], None]],
    state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write one checkpoint atomically: every writer fills a temp dir, then `state.json`, then a rename.

    A crash at any point leaves either the previous complete checkpoints or the new one, never half of it.
    Older checkpoints beyond `keep_last` are pruned afterwards.
    """
    root = Path(run_dir) / "checkpoints"
    final = root / f"{PREFIX}{iteration:06d}"
    tmp = root / f".tmp_{PREFIX}{iteration:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for write in writers:
        write(str(tmp))
    (tmp / "state.json").write_text(json.dumps({"iteration": iteration, **state}, indent=1))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in checkpoint_dirs(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint written: %s", final)
    return final


def latest(run_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint and its state.json, or None."""
    dirs = checkpoint_dirs(run_dir)
    if not dirs:
        log.warning("resume=true but %s has no checkpoint yet: starting from the beginning", run_dir)
        return None
    return dirs[-1], json.loads((dirs[-1] / "state.json").read_text())


def save(ctx: Any, iteration: int, sampler: Any) -> Path:
    """Checkpoint `iteration` of an RL run: trainer (and critic) weights and optimizer, data position, KL."""
    cfg = ctx.cfg
    writers = [lambda d: ctx.trainer.call("save", d), ctx.data.tokenizer.save_pretrained]
    if ctx.critic is not None:
        writers.append(lambda d: ctx.critic.call("save", d))
    state = {
        "sampler": sampler.state_dict(),
        "kl_coef": None if ctx.kl_controller is None else ctx.kl_controller.coef,
        "config": cfg.model_dump(mode="json"),
    }
    return commit(cfg.run_dir, iteration, writers, state, cfg.checkpoint.keep_last)


def restore(ctx: Any, sampler: Any) -> int:
    """Load the newest checkpoint of the run into the workers and the sampler; return its iteration."""
    found = latest(ctx.cfg.run_dir)
    if found is None:
        return 0
    path, state = found
    ctx.trainer.call("load", str(path))
    if ctx.critic is not None:
        ctx.critic.call("load", str(path))
    sampler.load_state_dict(state["sampler"])
    if ctx.kl_controller is not None and state.get("kl_coef") is not None:
        ctx.kl_controller.coef = state["kl_coef"]
    log.info("resumed from %s (iteration %d)", path, state["iteration"])
    return int(state["iteration"])


def _fsync_dir(path: Path) -> None:
    for p in path.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
