"""Run tracking: metrics (JSONL, TensorBoard, wandb), a Chrome-trace timeline, console progress, log files.

Everything here is controller-side except `setup_logging` (every process) and `Timeline(None)` (workers
that report their own phases). See design.md, "tracking/".
"""

from ascent.tracking.logs import setup_logging, worker_log_path
from ascent.tracking.metrics import MetricsLogger, read_metrics
from ascent.tracking.progress import SUMMARY_FIELDS, Progress
from ascent.tracking.timeline import PhaseRecord, Timeline

__all__ = [
    "SUMMARY_FIELDS",
    "MetricsLogger",
    "PhaseRecord",
    "Progress",
    "Timeline",
    "read_metrics",
    "setup_logging",
    "worker_log_path",
]
