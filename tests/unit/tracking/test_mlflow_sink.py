"""The MLflow sink against a real MLflow client and a local file store: params are the flattened config,
metrics read back equal what was logged, a resumed run continues the same MLflow run, and each failure at
start-up (not installed, unreachable, behind a proxy that refuses) names tracking.mlflow_uri."""

from __future__ import annotations

import http.server
import os
import socket
import sys
import threading

import mlflow  # the `dev` extra installs mlflow-skinny; at run time it is optional
import pytest

from ascent.errors import AscentError
from ascent.tracking import EventBus, Metrics, RunEnded, RunStarted
from ascent.tracking.mlflow_sink import MLFLOW_ID_FILE, MlflowSink, flatten_config

CONFIG = {"seed": 3, "train": {"lr": 1e-3, "betas": [0.9, 0.99]}, "tracking": {"mlflow_uri": None}}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # restored after the test (the sink sets it too)
    return tmp_path / "mlruns"


def run_once(run_dir, uri, steps, resume_step=0, config=CONFIG, end="finished"):
    sink = MlflowSink(run_dir, str(uri), experiment="exp", config=config)
    bus = EventBus([sink])
    bus.publish(RunStarted(str(run_dir), "train", config, total_steps=4, resume_step=resume_step))
    for step, values in steps:
        bus.publish(Metrics.of(step, values))
    bus.publish(RunEnded(end))
    bus.close()
    assert bus.sinks == () and sink.run_id
    return sink.run_id


def history(uri, run_id, key):
    client = mlflow.tracking.MlflowClient(tracking_uri=uri.as_uri())
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_metrics_and_params_read_back(tmp_path, store):
    run_id = run_once(
        tmp_path / "run",
        store,
        [(1, {"reward/mean": 0.25, "n": 3, "s": "x"}), (2, {"reward/mean": 0.5, "bad": float("nan")})],
    )
    client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
    run = client.get_run(run_id)
    assert history(store, run_id, "reward/mean") == [(1, 0.25), (2, 0.5)]
    assert (
        history(store, run_id, "n") == [(1, 3.0)]
        and "s" not in run.data.metrics
        and "bad" not in run.data.metrics
    )
    assert run.data.params == {
        "seed": "3",
        "train.lr": "0.001",
        "train.betas": "[0.9, 0.99]",
        "tracking.mlflow_uri": "null",
    }
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert client.get_experiment(run.info.experiment_id).name == "exp"


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path, store):
    first = run_once(tmp_path / "run", store, [(1, {"x": 1.0}), (2, {"x": 2.0})], end="interrupted")
    client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
    assert client.get_run(first).info.status == "KILLED"
    changed = {**CONFIG, "seed": 4, "extra": True}  # params are immutable in MLflow: the first value stays
    again = run_once(tmp_path / "run", store, [(3, {"x": 3.0})], resume_step=2, config=changed)
    assert again == first == (tmp_path / "run" / MLFLOW_ID_FILE).read_text().strip()
    assert history(store, first, "x") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    run = client.get_run(first)
    assert (
        run.info.status == "FINISHED"
        and run.data.params["seed"] == "3"
        and run.data.params["extra"] == "true"
    )
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_a_crash_marks_the_run_failed(tmp_path, store):
    run_id = run_once(tmp_path / "run", store, [(1, {"x": 1.0})], end="crashed")
    assert mlflow.tracking.MlflowClient(tracking_uri=store.as_uri()).get_run(run_id).info.status == "FAILED"


def test_flatten_config_cuts_long_values():
    flat = flatten_config({"a": {"b": {"c": "x" * 900}, "empty": {}}, "n": None})
    assert flat == {"a.b.c": "x" * 500, "a.empty": "{}", "n": "null"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server_fails_at_start_up_naming_the_field(tmp_path):
    uri = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(
        AscentError, match=r"tracking\.mlflow_uri='http://127\.0\.0\.1:\d+' cannot be reached"
    ):
        MlflowSink(tmp_path, uri, config=CONFIG)
    assert not (tmp_path / MLFLOW_ID_FILE).exists()


def test_requests_go_through_the_proxy_and_nothing_else_does(tmp_path, monkeypatch):
    """A local stand-in proxy answers every request with 404: the probe and MLflow's own requests reach it
    (by absolute URL, as a proxy receives them), the start-up error names the field, and the process
    environment has no proxy set afterwards."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    seen: list[str] = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            seen.append(self.path)
            body = b'{"error_code": "ENDPOINT_NOT_FOUND", "message": "no"}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(
            AscentError, match=r"tracking\.mlflow_uri='http://mlflow\.test:5000': MLflow refused"
        ):
            MlflowSink(tmp_path, "http://mlflow.test:5000", http_proxy=proxy, config=CONFIG)
    finally:
        server.shutdown()
    assert seen[0] == "http://mlflow.test:5000/health"
    assert any(p.startswith("http://mlflow.test:5000/api/2.0/mlflow/") for p in seen[1:]), seen
    assert not any(os.environ.get(n) for n in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"))


def test_not_installed_names_the_field_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    with pytest.raises(
        AscentError, match=r"tracking\.mlflow_uri='x'.*pip install mlflow-skinny.*mlflow_uri=null"
    ):
        MlflowSink(tmp_path, "x")
