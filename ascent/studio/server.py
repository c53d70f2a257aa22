"""Serving the studio: bind the socket first (port 0 picks a free one, an address in use fails at once),
then run uvicorn on it, in the foreground (`ascent studio`) or on a background thread (tests, screenshots).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from ascent.studio.app import create_app


class StudioServer:
    """The studio for `root` on (host, port); `url` (with `?token=` when there is a token) once bound."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        self.root, self.host, self.port, self.token = Path(root), host, port, token
        self.app = create_app(root, token)
        self.url: str | None = None
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None

    def bind(self) -> socket.socket:
        """Listen on (host, port); sets `port` and `url`. OSError when the address cannot be used."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family)
        self.port = sock.getsockname()[1]
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.port}/" + (f"?token={self.token}" if self.token else "")
        return sock

    def _server(self, log_level: str) -> Any:
        import uvicorn  # deferred: only a serving process needs it

        config = uvicorn.Config(
            self.app, log_level=log_level, access_log=log_level == "debug", timeout_graceful_shutdown=2
        )
        self._uvicorn = uvicorn.Server(config)
        return self._uvicorn

    def run(self, sock: socket.socket, log_level: str = "warning") -> None:
        """Serve on the bound `sock` until SIGINT/SIGTERM (uvicorn's handlers stop it gracefully)."""
        self._server(log_level).run(sockets=[sock])

    def start(self, log_level: str = "warning", timeout_s: float = 30.0) -> str:
        """Serve on a background thread; returns `url` once the server accepts connections."""
        sock = self.bind()
        server = self._server(log_level)
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="ascent-studio"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the studio did not start on {self.host}:{self.port} within {timeout_s} s"
                )
            time.sleep(0.01)
        assert self.url is not None
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
