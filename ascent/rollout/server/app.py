"""The FastAPI app of `OpenAIServer` (`ascent.rollout.server`): routes, API-key check, OpenAI-shaped errors.

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (bodies in `handlers.py`), `GET /v1/models`,
`GET /health` (no key needed: it tells only that the server is up and its policy version). Every other
route needs `Authorization: Bearer <key>` when the server has a key. The session a request's records are
filed under is its `X-Session-Id` header, else the bearer token it sent, else "default".
"""

from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ascent.rollout.server import handlers
from ascent.rollout.server.errors import APIError, validation_error
from ascent.rollout.server.schemas import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from ascent.rollout.server.front import Front

SESSION_HEADER = "x-session-id"


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_error(exc.errors()))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(
        APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind=kind)
    )


async def _internal(request: Request, exc: Exception) -> Response:
    """A bug: the client gets a 500 in OpenAI's shape; Starlette then re-raises it for uvicorn's log."""
    return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error"))


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def session_checker(api_key: str | None) -> Any:
    """A dependency: refuses a missing or wrong key with 401, returns the request's session key.

    A coroutine, so FastAPI runs it on the event loop: a plain function would be sent to a worker thread
    for every request (a thread hop and a lock hand-over each time, measured at ~15% of the loop's work)."""

    async def check(request: Request) -> str:
        token = _bearer(request)
        if api_key is not None:
            if token is None:
                raise APIError(
                    401,
                    "You didn't provide an API key: send it as `Authorization: Bearer <key>`.",
                    code="invalid_api_key",
                )
            if not hmac.compare_digest(token.encode(), api_key.encode()):
                raise APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        return request.headers.get(SESSION_HEADER) or token or "default"

    return check


async def _front(request: Request) -> Any:
    """The routes' dependency: the server the app serves (`app.state.front`). The route functions never
    close over it: FastAPI keeps them in module-level caches that outlive the app, and a closure would keep
    a stopped server alive with its engine (and the model behind it) for the rest of the process."""
    return request.app.state.front


def build_app(server: Front, lifespan: Any = None) -> FastAPI:
    """The routes over `server` (this process's engine, or a front-end process's channel to it)."""
    app = FastAPI(title="ascent", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.front = server
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal)
    session = Depends(session_checker(server.options.api_key))
    front = Depends(_front)
    card = {
        "id": server.options.model_name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "ascent",
        "max_model_len": server.options.limits.max_model_len,
    }

    @app.get("/health")
    async def health(server: Any = front) -> dict[str, Any]:
        return await server.health()  # type: ignore[no-any-return]

    @app.get("/v1/models")
    async def models(_: str = session) -> dict[str, Any]:
        return {"object": "list", "data": [dict(card)]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionRequest, key: str = session, server: Any = front) -> Any:
        return await handlers.chat_completions(server, body, key)

    @app.post("/v1/completions", response_model=None)
    async def complete(body: CompletionRequest, key: str = session, server: Any = front) -> Any:
        return await handlers.completions(server, body, key)

    return app
