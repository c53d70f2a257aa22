"""Log files per process: `<run_dir>/logs/<worker_name>.log`, and the controller's console.

Every process calls `setup_logging` once with its own name: the controller (`"controller"`, which also logs
to the console through rich) and each Ray worker (`"<group>_<rank>"`, done by the worker group). Handlers go
on the `ascent` package logger, so code logs with `logging.getLogger(__name__)` as usual. Calling it again
with the same arguments adds nothing. Inline workers share the controller's process and therefore its log.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

PACKAGE_LOGGER = "ascent"
LOG_DIR = "logs"
_FILE_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_PLAIN_CONSOLE_FORMAT = "%(asctime)s %(levelname)-7s %(message)s"
# `log.info(..., extra=FILE_ONLY)`: the log files get the record, the console does not (the progress lines,
# which reach the console through `Progress` at their own pace)
FILE_ONLY = {"ascent_console": False}


def worker_log_path(run_dir: str | os.PathLike[str], worker_name: str) -> Path:
    """Where `setup_logging(run_dir, worker_name)` writes."""
    return Path(run_dir) / LOG_DIR / f"{worker_name}.log"


def _has_handler(logger: logging.Logger, key: str) -> bool:
    return any(getattr(h, "_ascent_key", None) == key for h in logger.handlers)


def _tag(handler: logging.Handler, key: str) -> logging.Handler:
    handler._ascent_key = key  # type: ignore[attr-defined]
    return handler


def _file_handler(path: Path, worker_name: str) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter(_FILE_FORMAT.replace("%(name)s", f"[{worker_name}] %(name)s")))
    return handler


def _on_console(record: logging.LogRecord) -> bool:
    return getattr(record, "ascent_console", True)


def _console_handler() -> logging.Handler:
    """Rich on a terminal; plain lines (no ANSI codes, no wrapping) otherwise. Skips FILE_ONLY records."""
    handler: logging.Handler
    if sys.stderr.isatty():
        # deferred: rich, only on a terminal
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False, markup=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_PLAIN_CONSOLE_FORMAT))
    handler.addFilter(_on_console)
    return handler


def setup_logging(
    run_dir: str | os.PathLike[str] | None,
    worker_name: str,
    level: str | int = "INFO",
    *,
    console: bool | None = None,
) -> logging.Logger:
    """Send the `ascent` loggers to `<run_dir>/logs/<worker_name>.log` (and the console for the controller).

    `level`: a logging level or its name in any case (`tracking.log_level`). `console` defaults to True for
    `worker_name == "controller"`. `run_dir=None` skips the file. Idempotent:
    a handler already attached for the same file (or the console) is not added twice. Returns the logger
    `ascent.<worker_name>`.
    """
    package = logging.getLogger(PACKAGE_LOGGER)
    package.setLevel(level.upper() if isinstance(level, str) else level)
    if run_dir is not None:
        path = worker_log_path(run_dir, worker_name).resolve()
        key = f"file:{path}"
        if not _has_handler(package, key):
            package.addHandler(_tag(_file_handler(path, worker_name), key))
    wants_console = console if console is not None else worker_name == "controller"
    if wants_console and not _has_handler(package, "console"):
        package.addHandler(_tag(_console_handler(), "console"))
    return logging.getLogger(f"{PACKAGE_LOGGER}.{worker_name.replace('.', '_')}")
