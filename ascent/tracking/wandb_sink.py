"""Weights & Biases sink (`tracking.wandb_project`, `tracking.wandb_mode`, `tracking.http_proxy`).

The W&B run is started when the sink is built, at start-up, so a missing package or a missing API key stops
the run before anything heavy loads, with the fix. Its id is kept in `<run_dir>/wandb_run_id.txt`: a resumed
run continues the same W&B run. `offline` mode needs no key and no network: the run is written under
`<run_dir>/wandb/offline-run-*` (upload it later with `wandb sync`). The proxy goes to W&B's own settings,
not to the process environment. `wandb` is an optional extra, imported here only.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

from ascent.errors import AscentError
from ascent.tracking.events import Event, Metrics, RunEnded

WANDB_ID_FILE = "wandb_run_id.txt"


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id stored in the run directory (made and stored on first use)."""
    file = run_dir / WANDB_ID_FILE
    if file.exists():
        return file.read_text(encoding="utf-8").strip()
    run_id = uuid.uuid4().hex[:12]
    file.write_text(run_id + "\n", encoding="utf-8")
    return run_id


def _import_wandb(project: str) -> Any:
    try:
        import wandb  # deferred: wandb, optional
    except ImportError as e:
        raise AscentError(
            f"tracking.wandb_project={project!r}: Weights & Biases is not installed; `pip install wandb`, or "
            "set tracking.wandb_project=null to log to JSONL/TensorBoard only."
        ) from e
    return wandb


class WandbSink:
    """Log each `Metrics` event's numbers to a W&B run; finish it (exit code 1 unless finished) at
    `RunEnded`."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        project: str,
        *,
        mode: str = "online",
        http_proxy: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        wandb = _import_wandb(project)
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(http_proxy=http_proxy, https_proxy=http_proxy) if http_proxy else None
        try:
            self.run = wandb.init(
                project=project,
                name=run_dir.name,
                id=wandb_run_id(run_dir),
                resume="allow",
                dir=str(run_dir),
                mode=mode,
                config=dict(config or {}),
                settings=settings,
            )
        except Exception as e:
            raise AscentError(
                f"tracking.wandb_project={project!r} (tracking.wandb_mode={mode!r}): W&B could not start a "
                f"run: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}. Run `wandb "
                "login` or set WANDB_API_KEY; set tracking.http_proxy behind a proxy; or set "
                "tracking.wandb_mode=offline to log under the run directory and `wandb sync` it later."
            ) from e

    def handle(self, event: Event) -> None:
        if isinstance(event, Metrics):
            numbers = {k: v for k, v in event.values.items() if isinstance(v, int | float)}
            self.run.log(numbers, step=event.step)
        elif isinstance(event, RunEnded):
            self._finish(0 if event.state == "finished" else 1)

    def _finish(self, exit_code: int) -> None:
        if self.run is not None:
            run, self.run = self.run, None
            run.finish(exit_code=exit_code)

    def close(self) -> None:
        self._finish(0)
