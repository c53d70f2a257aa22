"""Per-iteration scalar metrics: a JSONL file (always), TensorBoard (optional) and wandb (optional).

The controller owns one `MetricsLogger` per run. `<run_dir>/metrics.jsonl` is the source of truth: one JSON
object per `log` call with `step`, `time` (unix seconds) and the metrics, flushed line by line so a crash
loses nothing already logged. Non-finite values are written as `null` (JSON has no NaN). TensorBoard event
files go to `<run_dir>/tensorboard`. Resuming appends to the same files; `purge_step` drops what a crashed
run logged after the checkpoint it resumes from.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_run_id.txt"
_RESERVED_KEYS = ("step", "time")


def to_scalar(value: Any) -> float | int | str | None:
    """A metric value as something JSON can hold: finite number, None (non-finite/empty) or a string."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str) or value is None:
        return value
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        return str(value)
    return number if math.isfinite(number) else None


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file (or of `<path>/metrics.jsonl` when `path` is a run directory).

    Blank lines are skipped, and so is a line that does not parse (a crash mid-write leaves at most one).
    """
    file = Path(path)
    if file.is_dir():
        file = file / METRICS_FILE
    if not file.exists():
        return []
    records = []
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s:%d is not valid JSON (interrupted write?); skipped", file, number)
    return records


def _purge_jsonl(file: Path, purge_step: int) -> None:
    """Rewrite `file` atomically without the records whose step is >= purge_step."""
    kept = [r for r in read_metrics(file) if not isinstance(r.get("step"), int) or r["step"] < purge_step]
    tmp = file.with_name(file.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in kept)
    os.replace(tmp, file)


def _wandb_run_id(run_dir: Path) -> str:
    """The wandb run id stored in the run directory, so a resumed run continues the same wandb run."""
    file = run_dir / WANDB_ID_FILE
    if file.exists():
        return file.read_text(encoding="utf-8").strip()
    run_id = uuid.uuid4().hex[:12]
    file.write_text(run_id + "\n", encoding="utf-8")
    return run_id


class MetricsLogger:
    """Write scalar metrics to `<run_dir>/metrics.jsonl`, TensorBoard and (optionally) wandb.

    `purge_step`: on resume, the step the run continues from; records with step >= purge_step that an
    interrupted run left behind are removed (JSONL rewritten atomically; TensorBoard's own purge_step).
    `config`: a plain dict stored with the wandb run.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
        purge_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        if purge_step is not None and self.path.exists():
            _purge_jsonl(self.path, purge_step)
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = self._open_tensorboard(purge_step) if tensorboard else None
        self._wandb = self._open_wandb(wandb_project, run_name, config) if wandb_project else None

    @classmethod
    def from_config(cls, tracking: Any, run_dir: str | os.PathLike[str], **kwargs: Any) -> MetricsLogger:
        """Build from a `TrackingConfig` (only `tensorboard` and `wandb_project` are read)."""
        return cls(run_dir, tensorboard=tracking.tensorboard, wandb_project=tracking.wandb_project, **kwargs)

    def _open_tensorboard(self, purge_step: int | None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR), purge_step=purge_step)

    def _open_wandb(self, project: str, run_name: str | None, config: Mapping[str, Any] | None) -> Any:
        try:
            import wandb
        except ImportError as e:
            raise RuntimeError(
                f"tracking.wandb_project={project!r}: Weights & Biases is not installed; "
                "`pip install wandb`, or set tracking.wandb_project=null to log to JSONL/TensorBoard only."
            ) from e
        return wandb.init(
            project=project,
            name=run_name or self.run_dir.name,
            id=_wandb_run_id(self.run_dir),
            resume="allow",
            dir=str(self.run_dir),
            config=dict(config or {}),
        )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record `metrics` at `step`: one JSONL line (flushed), TensorBoard scalars, wandb. Never raises on values."""
        values = {k: to_scalar(v) for k, v in metrics.items() if k not in _RESERVED_KEYS}
        record = {"step": int(step), "time": round(time.time(), 3), **values}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        numbers = {k: v for k, v in values.items() if isinstance(v, int | float)}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, global_step=int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=int(step))

    def close(self) -> None:
        """Flush and close every sink. Safe to call twice."""
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
