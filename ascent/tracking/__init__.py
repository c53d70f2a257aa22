"""Run tracking: a typed event bus and its sinks (metrics.jsonl, status.json, TensorBoard, W&B, MLflow), a
Chrome-trace timeline, console progress, log files.

A run opens its sinks with `open_tracking` and wraps its body in `tracked_run`, which publishes `RunStarted`
and `RunEnded`; the loop publishes one `Metrics` event per step. Everything here is controller-side except
`setup_logging` (every process) and `Timeline(None)` (workers that report their own phases). See design.md,
"tracking/".
"""

from ascent.tracking.events import EventBus, Metrics, RunEnded, RunStarted, Sink, tracked_run
from ascent.tracking.logs import setup_logging, worker_log_path
from ascent.tracking.metrics import JsonlSink, read_metrics
from ascent.tracking.progress import SUMMARY_FIELDS, Progress
from ascent.tracking.sinks import TensorBoardSink, open_tracking
from ascent.tracking.status import STATUS_FILE, StatusSink, read_status
from ascent.tracking.timeline import PhaseRecord, Timeline

__all__ = [
    "STATUS_FILE",
    "SUMMARY_FIELDS",
    "EventBus",
    "JsonlSink",
    "Metrics",
    "PhaseRecord",
    "Progress",
    "RunEnded",
    "RunStarted",
    "Sink",
    "StatusSink",
    "TensorBoardSink",
    "Timeline",
    "open_tracking",
    "read_metrics",
    "read_status",
    "setup_logging",
    "tracked_run",
    "worker_log_path",
]
