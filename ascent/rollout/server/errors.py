"""OpenAI-shaped errors of the HTTP server (`ascent.rollout.server`): one exception type, one body shape.

Every failure a client sees is `{"error": {"message", "type", "param", "code"}}` with an HTTP status, as the
OpenAI API answers, so the official clients raise their usual exceptions (`BadRequestError`,
`AuthenticationError`, ...). `validation_error` turns pydantic's field errors into that shape, naming the
field in OpenAI's style (`messages[0].role`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"}


class APIError(Exception):
    """A failure to answer with `status` and an OpenAI error body; `headers` go on the response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def field_path(loc: Sequence[str | int]) -> str | None:
    """pydantic's error location -> OpenAI's parameter name: ('body', 'messages', 0, 'role') ->
    'messages[0].role'. Union members' tags (`str`, `list[...]`) are left out."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.lower() in _TYPE_NAMES or "[" in part or part[:1].isupper():
            continue
        else:
            out += f".{part}" if out else part
    return out or None


def validation_error(errors: Sequence[Any]) -> APIError:
    """The first of pydantic's errors (a list of dicts with loc, msg, type) as a 400 naming its field."""
    first = dict(errors[0]) if errors else {"loc": (), "msg": "invalid request", "type": ""}
    param = field_path(tuple(first.get("loc", ())))
    if first.get("type") == "json_invalid":
        return bad_request(f"the request body is not valid JSON ({first.get('msg')}).", None)
    if param is None:
        return bad_request(f"the request body must be a JSON object ({first.get('msg')}).", None)
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    more = f" ({len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return bad_request(f"{param}: {message}{more}", param)
