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


def save(ctx: Any, iteration: int, sampler: Any) -> Path:
    """Write checkpoint `iteration` of the run atomically and prune to `checkpoint.keep_last`."""
    cfg = ctx.cfg
    root = Path(cfg.run_dir) / "checkpoints"
    final = root / f"{PREFIX}{iteration:06d}"
    tmp = root / f".tmp_{PREFIX}{iteration:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    ctx.trainer.call("save", str(tmp))
    if ctx.critic is not None:
        ctx.critic.call("save", str(tmp))
    ctx.data.tokenizer.save_pretrained(str(tmp))
    state = {
        "iteration": iteration,
        "sampler": sampler.state_dict(),
        "kl_coef": None if ctx.kl_controller is None else ctx.kl_controller.coef,
        "config": cfg.model_dump(mode="json"),
    }
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in checkpoint_dirs(cfg.run_dir)[: -cfg.checkpoint.keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint written: %s", final)
    return final


def restore(ctx: Any, sampler: Any) -> int:
    """Load the newest checkpoint of the run into the workers and the sampler; return its iteration."""
    dirs = checkpoint_dirs(ctx.cfg.run_dir)
    if not dirs:
        log.warning("resume=true but %s has no checkpoint yet: starting from iteration 0", ctx.cfg.run_dir)
        return 0
    path = dirs[-1]
    state = json.loads((path / "state.json").read_text())
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
