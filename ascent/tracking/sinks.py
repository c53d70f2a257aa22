"""The sinks a run's config asks for, on one bus (`open_tracking`), and the TensorBoard sink.

Always: `metrics.jsonl` (JsonlSink) and `status.json` (StatusSink). Per `tracking`: TensorBoard event files
under `<run_dir>/tensorboard`, W&B (`wandb_project`), MLflow (`mlflow_uri`). Every sink is opened here, at
start-up, so a tracker that cannot work stops the run before anything heavy loads, with the field to fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ascent.tracking.events import Event, EventBus, Metrics, RunStarted, Sink
from ascent.tracking.metrics import JsonlSink
from ascent.tracking.status import StatusSink

TENSORBOARD_DIR = "tensorboard"


class TensorBoardSink:
    """Scalars to `<run_dir>/tensorboard`; a resumed run drops the events logged after its checkpoint."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.log_dir = Path(run_dir) / TENSORBOARD_DIR
        self._writer: Any = None

    def _open(self, purge_step: int | None) -> Any:
        from torch.utils.tensorboard import SummaryWriter  # deferred: TensorBoard, optional

        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)
        return self._writer

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._open(event.resume_step + 1)
        elif isinstance(event, Metrics):
            writer = self._writer or self._open(None)
            for key, value in event.values.items():
                if isinstance(value, int | float):
                    writer.add_scalar(key, value, global_step=event.step)
            writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def open_tracking(tracking: Any, run_dir: str | os.PathLike[str], config: Mapping[str, Any]) -> EventBus:
    """A bus with the sinks `tracking` (a TrackingConfig) asks for; `config` is the resolved run config as a
    plain dict (W&B config, MLflow params). Raises AscentError naming the field when a tracker cannot
    start."""
    sinks: list[Sink] = [JsonlSink(run_dir), StatusSink(run_dir)]
    if tracking.tensorboard:
        sinks.append(TensorBoardSink(run_dir))
    bus = EventBus(sinks)
    try:
        if tracking.wandb_project:
            from ascent.tracking.wandb_sink import WandbSink  # deferred: wandb, optional

            bus.subscribe(
                WandbSink(
                    run_dir,
                    tracking.wandb_project,
                    mode=tracking.wandb_mode,
                    http_proxy=tracking.http_proxy,
                    config=dict(config),
                )
            )
        if tracking.mlflow_uri:
            from ascent.tracking.mlflow_sink import MlflowSink  # deferred: mlflow, optional

            bus.subscribe(
                MlflowSink(
                    run_dir,
                    tracking.mlflow_uri,
                    experiment=tracking.mlflow_experiment,
                    http_proxy=tracking.http_proxy,
                    config=config,
                )
            )
    except BaseException:
        bus.close()  # a W&B run already started is finished, not left dangling
        raise
    return bus
