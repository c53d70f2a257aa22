"""The studio's HTTP API and page: a FastAPI app over one RUNS_DIR.

Routes (all JSON except `/`, `/static/*` and the chart library): `GET /api/runs`, `GET /api/run?run=` (one
run: its kind and which views it has data for), `GET /api/metrics?run=&since=` (the points logged after step
`since`: the page polls it every ~2 s while a run trains), `GET /api/timeline?run=&iteration=`, `GET
/api/episodes?run=&iteration=&min_reward=&max_reward=&env=&status=&search=&offset=&limit=` (newest first,
one page), `GET /api/episode?run=&id=` (with a simulator episode's `steps`: frame, action, reward), `GET
/api/frame?run=&path=` (one of its frames, a PNG under `<run_dir>/frames`), `GET /api/config?run=`, `GET /api/schema?kind=`, `POST /api/validate`
{text, kind} and `POST /api/save` {text, kind, path, overwrite}. User errors answer 400 (404 for an unknown
run) with `{"error": message}`.

Access: with a token every request must carry it (`?token=` once, which sets a cookie and redirects, or
an `Authorization: Bearer` header), else 401. Without one (a loopback-only studio) the Host header must
be a loopback name, so a web page cannot reach the studio through DNS rebinding.
"""

from __future__ import annotations

import importlib.util
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from ascent.config import ConfigError
from ascent.errors import AscentError
from ascent.studio import configs, episodes, phases, runs
from ascent.studio.metrics import MetricsCache, metrics_payload

STATIC_DIR = Path(__file__).parent / "static"
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1"}
UNAUTHORIZED = (
    "401: this studio needs its token. Open the URL `ascent studio` printed (it ends in "
    "?token=...), or send the header `Authorization: Bearer TOKEN`.\n"
)


class ConfigText(BaseModel):
    text: str
    kind: str = "train"


class SaveRequest(ConfigText):
    path: str
    overwrite: bool = False


def plotly_js() -> Path:
    """plotly.min.js inside the installed `plotly` package (served locally: no CDN, no network)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise AscentError(
            "the `plotly` package is not installed; `pip install plotly` (an ascent dependency)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"


def create_app(root: str | Path, token: str | None = None) -> FastAPI:
    """The studio for the runs under `root`; `token` (None: none, loopback only) guards every request."""
    root = Path(root).resolve()
    cache = MetricsCache()
    app = FastAPI(title="ascent studio", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.root, app.state.token = root, token
    app.middleware("http")(_access_guard(token))
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.exception_handler(AscentError)
    async def user_error(request: Request, exc: AscentError) -> JSONResponse:
        code = 404 if isinstance(exc, runs.RunNotFound) else 400
        problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
        return JSONResponse({"error": str(exc), "problems": problems}, status_code=code)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [_request_problem(e) for e in exc.errors()]
        return JSONResponse({"error": "; ".join(problems), "problems": problems}, status_code=422)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/vendor/plotly.min.js")
    def plotly() -> FileResponse:
        return FileResponse(plotly_js(), media_type="text/javascript")

    _run_routes(app, root, cache)
    _config_routes(app, root)
    return app


def _run_routes(app: FastAPI, root: Path, cache: MetricsCache) -> None:
    """The read-only views of the runs: the list, one run, its metrics, timeline and episodes."""

    @app.get("/api/runs")
    def list_runs() -> dict[str, Any]:
        return {"root": str(root), "runs": runs.describe_runs(root, cache)}

    @app.get("/api/run")
    def one_run(run: str) -> dict[str, Any]:
        return runs.describe_run(root, runs.resolve_run(root, run), cache)

    @app.get("/api/metrics")
    def metrics(run: str, since: int = -1) -> dict[str, Any]:
        run_dir = runs.resolve_run(root, run)
        return metrics_payload(run_dir, cache, since, runs.run_kind(run_dir))

    @app.get("/api/timeline")
    def timeline(run: str, iteration: int | None = None) -> dict[str, Any]:
        return phases.iteration_phases(runs.resolve_run(root, run), iteration)

    @app.get("/api/episodes")
    def list_episodes(
        run: str,
        iteration: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        env: str | None = None,
        status: str | None = None,
        search: str | None = None,
        offset: int = 0,
        limit: int = episodes.DEFAULT_LIMIT,
    ) -> dict[str, Any]:
        run_dir = runs.resolve_run(root, run)
        filters = {
            "iteration": iteration,
            "min_reward": min_reward,
            "max_reward": max_reward,
            "env": env or None,
            "status": status or None,
            "search": search or None,
        }
        return episodes.list_episodes(run_dir, filters, offset, limit, runs.run_kind(run_dir))

    @app.get("/api/episode")
    def episode(run: str, id: int) -> dict[str, Any]:
        return episodes.episode_detail(runs.resolve_run(root, run), id)

    @app.get("/api/frame", response_model=None)
    def frame(run: str, path: str) -> FileResponse | JSONResponse:
        try:
            return FileResponse(
                episodes.frame_path(runs.resolve_run(root, run), path), media_type="image/png"
            )
        except FileNotFoundError as e:
            return JSONResponse({"error": str(e)}, status_code=404)


def _config_routes(app: FastAPI, root: Path) -> None:
    """A run's config, the schema's field descriptions, and validating and saving a config's text."""

    @app.get("/api/config")
    def run_config(run: str) -> dict[str, Any]:
        run_dir = runs.resolve_run(root, run)
        return configs.run_config(run_dir, runs.run_kind(run_dir))

    @app.get("/api/schema")
    def schema(kind: str = "train") -> dict[str, Any]:
        return {"kind": kind, "fields": configs.field_descriptions(kind)}

    @app.post("/api/validate")
    def validate(body: ConfigText) -> dict[str, Any]:
        return configs.validate_text(body.text, body.kind)

    @app.post("/api/save")
    def save(body: SaveRequest) -> dict[str, Any]:
        path = configs.save_text(root, body.path, body.text, body.kind, body.overwrite)
        return {"saved": str(path), "relative": path.relative_to(root).as_posix()}


def _request_problem(err: Any) -> str:
    """One of FastAPI's request validation errors as a sentence: the field, the value sent, what it needs."""
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
    where = ".".join(loc) or "the request body"
    if err.get("type") == "missing":
        return f"{where} is missing: the request must send it"
    got = repr(err.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    return f"{where}={got}: {err.get('msg', 'invalid')}"


def _access_guard(token: str | None) -> Any:
    """The middleware: the token check (when there is one), else the loopback Host check."""

    async def guard(request: Request, call_next: Any) -> Response:
        if token is None:
            host = urlsplit("//" + request.headers.get("host", "")).hostname or ""
            if host not in LOOPBACK_NAMES:
                return PlainTextResponse(f"403: host {host!r} is not a loopback name.\n", status_code=403)
            return await call_next(request)
        cookie = f"ascent_studio_{request.url.port or 0}"
        offered = request.query_params.get("token")
        if offered is not None and _same(offered, token) and request.url.path == "/":
            response = RedirectResponse("/", status_code=303)  # the token leaves the address bar
            response.set_cookie(cookie, token, httponly=True, samesite="strict")
            return response
        header = request.headers.get("authorization", "")
        sent = header[len("Bearer ") :].strip() if header.startswith("Bearer ") else None
        sent = sent or offered or request.cookies.get(cookie)
        if sent is None or not _same(sent, token):
            return PlainTextResponse(UNAUTHORIZED, status_code=401)
        return await call_next(request)

    return guard


def _same(sent: str, token: str) -> bool:
    return secrets.compare_digest(sent.encode(), token.encode())
