"""`ascent studio` refuses what it cannot serve, with the option to change; the page's files ship."""

from __future__ import annotations

import socket
import tomllib
from fnmatch import fnmatch
from pathlib import Path

from typer.testing import CliRunner

from ascent.cli import app
from ascent.studio.app import STATIC_DIR, plotly_js

REPO = Path(__file__).resolve().parents[3]


def test_a_runs_dir_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["studio", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert "RUNS_DIR" in result.output and "is not a directory" in result.output


def test_a_port_in_use_is_refused_naming_the_option(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["studio", str(tmp_path), "--port", str(port)])
    assert result.exit_code == 2
    assert f"--port {port}: cannot listen there" in result.output and "choose another --port" in result.output


def test_every_static_file_ships_in_the_package_and_plotly_is_local() -> None:
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = globs["ascent.studio"]
    files = [p.relative_to(STATIC_DIR.parent).as_posix() for p in STATIC_DIR.iterdir()]
    assert files and all(any(fnmatch(f, g) for g in shipped) for f in files), (files, shipped)
    assert plotly_js().is_file() and plotly_js().stat().st_size > 1_000_000
    for file in STATIC_DIR.iterdir():  # nothing from the network: no CDN, no remote font
        text = file.read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, file.name


def test_the_studio_imports_only_what_design_md_allows_and_no_torch() -> None:
    """design.md: studio imports tracking and config (and errors); it reads the experience store and probes
    the run-dir lock with the readers in `tracking`, so no transport or orchestrator module is loaded (and
    `messages`, the plain-Python leaf under tracking's store reader, is all that comes with them)."""
    import subprocess
    import sys

    code = "import sys, ascent.studio; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.split()
    assert "torch" not in loaded and "transformers" not in loaded
    allowed = ("ascent.studio", "ascent.config", "ascent.tracking", "ascent.errors", "ascent.messages")
    ours = [m for m in loaded if m.startswith("ascent.")]
    assert all(m.startswith(allowed) for m in ours), [m for m in ours if not m.startswith(allowed)]
