"""`ascent bench NAME ARGS...`: import bench/NAME.py from the working directory or the source checkout and
call its `main(ARGS)` (the benchmarks ship with the repository, not the installed package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import typer

from ascent.errors import AscentError


def find_bench(name: str, repo_root: Path) -> Path | None:
    """bench/<name>.py under the working directory, else under the source checkout ascent came from."""
    for root in (Path.cwd(), repo_root):
        path = root / "bench" / f"{name}.py"
        if path.is_file():
            return path
    return None


def run_bench(name: str, argv: list[str], repo_root: Path) -> None:
    """Import bench/<name>.py and call its `main(argv)`; a non-zero int result becomes the exit code."""
    path = find_bench(name, repo_root)
    if path is None:
        raise AscentError(
            f"bench/{name}.py not found (looked under {Path.cwd()} and {repo_root}); the benchmarks ship "
            "with the source checkout, not the installed package: run from the repository root."
        )
    spec = importlib.util.spec_from_file_location(f"ascent_bench_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
        entry = getattr(module, "main", None)
        if not callable(entry):
            raise AscentError(f"{path} has no main(argv) function to call.")
        code = entry(list(argv))
    finally:
        sys.path.remove(str(path.parent))
    if isinstance(code, int) and not isinstance(code, bool) and code:
        raise typer.Exit(code)
