"""MLflow sink (`tracking.mlflow_uri`, `tracking.mlflow_experiment`, `tracking.http_proxy`).

Built at start-up: it checks that the tracking server answers (an unreachable URI stops the run there,
naming `tracking.mlflow_uri`), finds or creates the experiment, and starts the MLflow run with the flattened
config as its params (`train.lr`, `rollout.samples_per_prompt`, ...). The MLflow run id is kept in
`<run_dir>/mlflow_run_id.txt`, so a resumed run continues the same MLflow run (params it already has are
kept; MLflow cannot delete metrics, so steps a crashed run logged past its checkpoint are logged again).
Each `Metrics` event becomes one `log_batch`; `RunEnded` marks the run FINISHED, KILLED or FAILED.

A local directory or `file:` URI uses MLflow's file store, which MLflow 3 keeps working behind
MLFLOW_ALLOW_FILE_STORE; naming such a URI is taken as that opt-in. `tracking.http_proxy` applies to this
sink's requests only: the proxy variables are set around each MLflow call and restored after it.
`mlflow` (the light `mlflow-skinny` is enough) is an optional extra, imported here only.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ascent.errors import AscentError
from ascent.tracking.events import Event, Metrics, RunEnded

log = logging.getLogger(__name__)

MLFLOW_ID_FILE = "mlflow_run_id.txt"
PROBE_TIMEOUT_S = 10.0
_PARAM_VALUE_CHARS = 500  # the smallest limit MLflow servers have had
_BATCH = 100  # params per log_batch (MLflow's limit)
_END_STATES = {"finished": "FINISHED", "interrupted": "KILLED", "crashed": "FAILED"}
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"train": {"lr": 1e-5}} -> {"train.lr": "1e-05"}; lists and None as JSON; values cut to 500 chars."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten_config(value, f"{name}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            out[name] = text[:_PARAM_VALUE_CHARS]
    return out


def metric_key(key: str) -> str:
    """A metric name MLflow accepts (letters, digits, `_-. /`); anything else becomes `_`."""
    return re.sub(r"[^\w\-. /]", "_", key)


@contextmanager
def proxy_env(proxy: str | None) -> Iterator[None]:
    """Route the HTTP requests made in the body through `proxy`; the variables are restored after."""
    if not proxy:
        yield
        return
    saved = {name: os.environ.get(name) for name in _PROXY_VARS}
    os.environ.update(dict.fromkeys(_PROXY_VARS, proxy))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def resolve_uri(uri: str) -> str:
    """A local path (or `file:` URI) as an absolute `file://` URI, with MLflow's file-store opt-in set; any
    other URI unchanged."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        return uri
    path = Path(parsed.path if parsed.scheme == "file" else uri).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return path.as_uri()


def probe_server(uri: str, proxy: str | None) -> None:
    """Raise AscentError naming tracking.mlflow_uri when an http(s) URI does not answer at all."""
    if urlparse(uri).scheme not in ("http", "https"):
        return
    handler = urllib.request.ProxyHandler({"http": proxy, "https": proxy} if proxy else {})
    try:
        urllib.request.build_opener(handler).open(
            uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S
        ).close()
    except urllib.error.HTTPError:
        return  # it answered (maybe 401/404 behind a gateway): reachable
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise AscentError(
            f"tracking.mlflow_uri={uri!r} cannot be reached ({reason}). Start the MLflow server "
            "(`mlflow server --port 5000`), fix the address, set tracking.http_proxy if it is behind a "
            "proxy, or set tracking.mlflow_uri=null."
        ) from None


def _import_mlflow(uri: str) -> Any:
    try:
        import mlflow  # deferred: mlflow, optional
    except ImportError as e:
        raise AscentError(
            f"tracking.mlflow_uri={uri!r}: MLflow is not installed; `pip install mlflow-skinny` (the light "
            "client is enough), or set tracking.mlflow_uri=null."
        ) from e
    return mlflow


class MlflowSink:
    """Log each `Metrics` event to one MLflow run, which outlives resumes of the ascent run."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        uri: str,
        *,
        experiment: str | None = None,
        http_proxy: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.mlflow = _import_mlflow(uri)
        self.proxy = http_proxy
        self.run_dir = Path(run_dir)
        self.uri = resolve_uri(uri)
        probe_server(self.uri, http_proxy)
        try:
            with proxy_env(http_proxy):
                self.client = self.mlflow.tracking.MlflowClient(tracking_uri=self.uri)
                self.run_id = self._open_run(experiment or "Default", flatten_config(config or {}))
        except AscentError:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise AscentError(
                f"tracking.mlflow_uri={uri!r}: MLflow refused to start the run: {first}. Check the URI and "
                "tracking.mlflow_experiment, the server's credentials (MLFLOW_TRACKING_TOKEN or "
                "MLFLOW_TRACKING_USERNAME/PASSWORD), or set tracking.mlflow_uri=null."
            ) from e
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / MLFLOW_ID_FILE).write_text(self.run_id + "\n", encoding="utf-8")

    def _open_run(self, experiment: str, params: dict[str, str]) -> str:
        """The stored run (resumed) or a new one in `experiment`; logs the params it does not have yet."""
        run = self._stored_run()
        if run is None:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run = self.client.create_run(experiment_id, run_name=self.run_dir.name)
        else:
            self.client.update_run(run.info.run_id, status="RUNNING")
        new = [self.mlflow.entities.Param(k, v) for k, v in params.items() if k not in run.data.params]
        for i in range(0, len(new), _BATCH):
            self.client.log_batch(run.info.run_id, params=new[i : i + _BATCH])
        return str(run.info.run_id)

    def _stored_run(self) -> Any:
        file = self.run_dir / MLFLOW_ID_FILE
        if not file.exists():
            return None
        run_id = file.read_text(encoding="utf-8").strip()
        try:
            return self.client.get_run(run_id)
        except self.mlflow.exceptions.MlflowException:
            log.warning("MLflow run %s of %s is not at %s; starting a new MLflow run", run_id, file, self.uri)
            return None

    def handle(self, event: Event) -> None:
        if isinstance(event, Metrics):
            stamp = int(event.time * 1000)
            metrics = [
                self.mlflow.entities.Metric(metric_key(k), float(v), stamp, event.step)
                for k, v in event.values.items()
                if isinstance(v, int | float)
            ]
            with proxy_env(self.proxy):
                for i in range(0, len(metrics), 1000):
                    self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        elif isinstance(event, RunEnded):
            with proxy_env(self.proxy):
                self.client.set_terminated(self.run_id, _END_STATES[event.state], int(time.time() * 1000))

    def close(self) -> None:
        """Nothing held open: every call went to the server."""
