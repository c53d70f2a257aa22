"""`ascent studio [RUNS_DIR]`: serve the web UI over a directory of runs (`ascent.studio`).

Bound to 127.0.0.1 by default, without a token. Bound to any other address it requires a token (`--token`,
or ASCENT_STUDIO_TOKEN, or one generated here) and prints the URL that carries it; requests without it get
401. `ascent.cli` registers `studio_command` as the command.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from ascent.entrypoints.guard import ErrorGuard
from ascent.errors import AscentError

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class StudioError(AscentError):
    """A studio that cannot start: no such runs directory, an address it cannot listen on."""


def studio_command(
    runs_dir: Annotated[
        str, typer.Argument(help="Directory holding run directories (searched a few levels deep).")
    ] = "runs",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0 picks a free one).")
    ] = 8765,
    host: Annotated[
        str, typer.Option(help="Address to bind; anything but loopback requires a token.")
    ] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            help="Access token (or ASCENT_STUDIO_TOKEN); generated when bound wider and not given.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "warning",
) -> None:
    """Web UI: runs and their status, live metric plots, phase timeline, episodes, config editor.

    Example: ascent studio runs/ --port 8765; open the URL it prints.
    """

    with ErrorGuard():
        root = Path(runs_dir)
        if not root.is_dir():
            raise StudioError(f"RUNS_DIR {runs_dir!r} is not a directory; pass the folder your runs are in.")
        token = token or os.environ.get("ASCENT_STUDIO_TOKEN") or None
        if token is None and host not in LOOPBACK:
            token = secrets.token_urlsafe(24)
        from ascent.studio import StudioServer  # deferred: fastapi; `ascent.cli` imports this module

        server = StudioServer(root, host, port, token)
        try:
            sock = server.bind()
        except OSError as err:
            if err.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
                raise
            raise StudioError(
                f"--host {host} --port {port}: cannot listen there ({err.strerror}); choose "
                "another --port (0 picks a free one) or --host."
            ) from err
        typer.echo(f"ascent studio: {root.resolve()} at {server.url}", err=False)
        server.run(sock, log_level)
