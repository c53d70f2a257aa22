"""Runs codes through the Python tool as whatever user starts it (test_sandbox_escapes.py starts it as uid
65534): reads `[[name, code], ...]` as JSON on stdin, runs them all at once, prints `{name: [ok, text]}`.

It imports only the tool's own modules, not the `ascent.envs` package (whose dependencies a bare system
Python lacks): the packages above them are stood in for by empty modules."""

from __future__ import annotations

import json
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main() -> None:
    sys.path.insert(0, str(ROOT))
    for name in ("ascent.envs", "ascent.envs.tools"):
        package = types.ModuleType(name)
        package.__path__ = [str(ROOT.joinpath(*name.split(".")))]
        sys.modules[name] = package
    from ascent.envs.tools.python import run_python  # deferred: after the stand-ins above

    cases = json.load(sys.stdin)
    with ThreadPoolExecutor(len(cases)) as pool:
        results = pool.map(lambda case: run_python(case[1]), cases)
        print(json.dumps({name: [r.ok, r.text()] for (name, _), r in zip(cases, results, strict=True)}))


if __name__ == "__main__":
    main()
