"""Doctor checks of the trackers a config asks for: Weights & Biases (installed; a key in WANDB_API_KEY or
~/.netrc, or offline mode) and MLflow (installed; its tracking URI reachable)."""

from __future__ import annotations

import importlib.util
import netrc
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ascent.doctor.report import CheckResult, fail, ok, skipped
from ascent.doctor.system import existing_parent

WANDB_HOST = "api.wandb.ai"


def wandb_key_source(netrc_path: Path | None = None) -> str | None:
    """Where a W&B key is found: WANDB_API_KEY, or a ~/.netrc entry for api.wandb.ai; None when nowhere."""
    if os.environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    path = netrc_path or Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        auth = netrc.netrc(str(path)).authenticators(WANDB_HOST)
    except (OSError, netrc.NetrcParseError):
        return None
    return str(path) if auth and auth[2] else None


def check_wandb(tracking: Any) -> CheckResult:
    name = "W&B"
    project = tracking.wandb_project
    if not project:
        return skipped(name, "tracking.wandb_project is not set")
    mode = tracking.wandb_mode  # what the W&B sink passes to wandb.init
    if importlib.util.find_spec("wandb") is None:
        return fail(
            name,
            f"tracking.wandb_project={project!r} but wandb is not installed",
            "pip install wandb, or unset tracking.wandb_project.",
        )
    if mode in ("offline", "disabled"):
        return ok(name, f"wandb installed, mode {mode}: no key needed (sync later with `wandb sync`)")
    source = wandb_key_source()
    if source is None:
        return fail(
            name,
            "wandb is online but no key: WANDB_API_KEY is unset and ~/.netrc has no api.wandb.ai",
            "run `wandb login` (or export WANDB_API_KEY), or set tracking.wandb_mode=offline.",
        )
    proxy = tracking.http_proxy
    return ok(name, f"wandb installed, key from {source}" + (f", proxy {proxy}" if proxy else ""))


def uri_reachable(uri: str, proxy: str | None = None, timeout_s: float = 5.0) -> str | None:
    """None when an http(s) URI answers (any HTTP status) or a file/local store's directory can be made."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        handlers = [urllib.request.ProxyHandler({"http": proxy, "https": proxy})] if proxy else []
        opener = urllib.request.build_opener(*handlers)
        try:
            opener.open(uri, timeout=timeout_s).close()
        except urllib.error.HTTPError:
            return None  # it answered
        except (urllib.error.URLError, OSError) as err:
            return str(getattr(err, "reason", err))
        return None
    if parsed.scheme in ("", "file"):
        target = existing_parent(parsed.path or uri)
        return None if os.access(target, os.W_OK) else f"{target} is not writable"
    return None  # databricks, sqlite, ...: mlflow's own client resolves those


def check_mlflow(tracking: Any) -> CheckResult:
    name = "MLflow"
    uri = tracking.mlflow_uri
    if not uri:
        return skipped(name, "tracking.mlflow_uri is not set (or this ascent has no MLflow sink yet)")
    if importlib.util.find_spec("mlflow") is None:
        return fail(
            name,
            f"tracking.mlflow_uri={uri!r} but mlflow is not installed",
            "pip install mlflow, or unset tracking.mlflow_uri.",
        )
    error = uri_reachable(uri, tracking.http_proxy)
    if error is not None:
        return fail(
            name,
            f"tracking.mlflow_uri={uri!r}: no answer ({error})",
            "start the MLflow server (`mlflow server`), fix the URI, or set tracking.http_proxy.",
        )
    return ok(name, f"mlflow installed, {uri} answers")


def check_trackers(tracking: Any) -> list[CheckResult]:
    return [check_wandb(tracking), check_mlflow(tracking)]
