"""The one loader of user plug-ins named by import path: rewards, policy losses, advantage estimators,
environments, agents (`reward.fn=mypkg.rewards:score`,
`rollout.source={name: env, env: mypkg.envs:GuessNumber}`).

User code resolves as under `python -m`: from the current directory first, then PYTHONPATH, then the
installed packages. `add_plugin_root` puts the current directory on `sys.path` and on PYTHONPATH, so that the
processes a run starts later resolve the same names: reward workers, environment hosts and agent processes
(forkserver and spawn start fresh interpreters, which read PYTHONPATH) and the actors of a local Ray cluster
(its raylet inherits the environment). For a Ray cluster that ascent joins, Ray itself puts the driver's
current directory on its actors' sys.path.

A path that does not resolve is a `PluginError` naming the setting, the module and attribute, the directories
searched and the fix; a module that lacks the attribute lists its public callables.

A user module is imported in a child interpreter first (`probe_import`), once per process, before this
process imports it: one that ends its process at import (`os._exit(0)`, a crash, a kill) would otherwise end
the command with it, with status 0 and no word. The probe's verdict is a `PluginError` naming the setting,
the module, how its process ended and the last lines it printed; a module that raises at import (`sys.exit`
included) is left to the import here, which says so. A user module therefore runs its import-time code twice.
Host processes (multiprocessing children: reward workers, environment hosts) skip the probe: there a process
that ends is already the failure of the call that imported the module, not of the run.

Like `ascent.errors`, a leaf: it imports nothing from ascent but `errors`, so every layer may use it.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from ascent.errors import AscentError

IMPORT_PATH_FORM = "pkg.module:name"
PROBE_TIMEOUT_S = 300.0  # a user module's import in the probe; past it the module counts as hanging
PROBE_TAIL = 1000  # characters of what the probe printed that an error quotes
_PROBED: set[str] = set()  # modules whose import returned in a probe of this process


class PluginError(AscentError, ValueError):
    """A plug-in import path that does not resolve; the message names the setting, where it looked and the
    fix."""


def add_plugin_root(directory: str | os.PathLike[str] | None = None) -> str:
    """Put `directory` (default: the current one) first on sys.path and PYTHONPATH, once; returns it.

    PYTHONPATH carries it to processes started later (spawn, forkserver, the Ray workers of a local
    cluster), which start in a fresh interpreter and would not see this process's sys.path otherwise."""
    root = str(Path(directory or os.getcwd()).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return root


def split_import_path(spec: str, field: str) -> tuple[str, str]:
    """`'pkg.mod:obj.attr'` -> ('pkg.mod', 'obj.attr'); PluginError naming `field` when malformed."""
    module, sep, attr = spec.strip().partition(":")
    if not sep or not module or not attr or ":" in attr or " " in spec.strip():
        raise PluginError(
            f"{field}={spec!r}: not an import path; write it as `{IMPORT_PATH_FORM}` (a module that Python "
            "can import, a colon, then the name defined in it)."
        )
    return module, attr


def load_plugin(spec: str, field: str, *, must_call: bool = True) -> Any:
    """The object `pkg.module:name` (name may be dotted: `Class.method`) names, importing the module from the
    current directory first. `field` names the setting in errors (`reward.fn`, `rollout.source.env`)."""
    module_name, attr = split_import_path(spec, field)
    label = f"{field}={spec.strip()!r}"
    add_plugin_root()
    module = _import(module_name, label)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise PluginError(_missing_attribute(module, attr, label))
        target = getattr(target, part)
    if must_call and not callable(target):
        raise PluginError(
            f"{label}: {attr} in {_where(module)} is a {type(target).__name__}, not callable (a function or "
            f"a class); point at a callable (its public callables: {_callables(module)})."
        )
    return target


def check_import(spec: str, field: str) -> None:
    """Import the module of `pkg.module:name` in a child interpreter only (`probe_import`): a PluginError
    naming `field` when that ends its process or hangs. For user code that runs in host processes only (an
    environment), so that a module which ends its process at import is named at start-up."""
    module_name, _ = split_import_path(spec, field)
    add_plugin_root()
    probe_import(module_name, f"{field}={spec.strip()!r}")


def resolve(
    registry: Mapping[str, Callable[..., Any]], value: str, field: str = "algorithm"
) -> Callable[..., Any]:
    """A registry's entry by name, or a user's function by import path `pkg.module:function`: registry,
    "name" | "pkg.mod:fn" -> the callable; a PluginError names `field`, the value and the fix (the registry's
    names, or where an import path was looked for)."""
    if value in registry:
        return registry[value]
    if ":" not in value:
        raise PluginError(
            f"{field}={value!r}: not a known name; choose one of {', '.join(sorted(registry))} "
            f"or give an import path `{IMPORT_PATH_FORM}` to your own function."
        )
    fn: Callable[..., Any] = load_plugin(value, field)
    return fn


def _import(module_name: str, label: str) -> ModuleType:
    probe_import(module_name, label)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise PluginError(_not_found(module_name, missing, label)) from err
        raise PluginError(  # the module exists; something it imports does not
            f"{label}: importing {module_name!r} failed: it imports {missing!r}, which is not installed; "
            f"install it (pip install ...) or fix that import ({err})."
        ) from err
    except SystemExit as err:  # the user's module ended the process at import: not the run's way to end
        raise PluginError(
            f"{label}: importing {module_name!r} called sys.exit({err.code!r}); fix the module (a module "
            "ascent imports must not exit; keep script code under `if __name__ == '__main__':`)."
        ) from err
    except Exception as err:  # the user's module raised while it was imported
        raise PluginError(
            f"{label}: importing {module_name!r} raised {type(err).__name__}: {err}; fix the module (run "
            f"`python -c 'import {module_name}'` to see the traceback)."
        ) from err


# run by the probe's interpreter: import the module with the caller's sys.path, then say that the import
# returned (whether it raised is the caller's import's to report), and end without running exit handlers
_PROBE = """
import importlib, json, os, sys
name, paths, said = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
sys.path[:] = paths
try:
    importlib.import_module(name)
except BaseException:
    pass
with open(said, "w") as f:
    f.write("returned")
os._exit(0)
"""


def probe_import(module_name: str, label: str) -> None:
    """Import `module_name` in a child interpreter (this process's sys.path, environment and directory)
    unless it is imported here already, is ascent's own, was probed before, or this is a host process;
    a PluginError naming `label` when that import ended its process or hung (see the module doc)."""
    top = module_name.split(".")[0]
    if module_name in sys.modules or top == "ascent" or module_name in _PROBED:
        return
    if multiprocessing.parent_process() is not None:  # a host: its death fails the call, not the run
        return
    with tempfile.TemporaryDirectory(prefix="ascent-probe-") as tmp:
        said = os.path.join(tmp, "said")
        with open(os.path.join(tmp, "output"), "w+b") as output:
            code = _run_probe(module_name, said, output, label)
            if os.path.exists(said):
                _PROBED.add(module_name)
                return
            output.seek(max(0, output.seek(0, os.SEEK_END) - 4 * PROBE_TAIL))
            printed = output.read().decode("utf-8", "replace").strip()[-PROBE_TAIL:]
    shown = f"; its last output: {printed!r}" if printed else ""
    raise PluginError(
        f"{label}: importing {module_name!r} ended its process ({_ended(code)}) before the import "
        f"returned{shown}. Fix the module: a module ascent imports must not end its process (os._exit, "
        "a crash, a kill); keep script code under `if __name__ == '__main__':`."
    )


def _run_probe(module_name: str, said: str, output: IO[bytes], label: str) -> int:
    """The probe's exit status; a PluginError past PROBE_TIMEOUT_S."""
    argv = [sys.executable, "-c", _PROBE, module_name, json.dumps(sys.path), said]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output)
    try:
        return proc.wait(PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PluginError(
            f"{label}: importing {module_name!r} took more than {PROBE_TIMEOUT_S:g} s (in a child process "
            f"ascent imports plug-ins in first); fix the module's import (`python -c 'import {module_name}'` "
            "shows where it waits)."
        ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _not_found(module_name: str, missing: str, label: str) -> str:
    top = missing.split(".")[0]
    looked = ", ".join(searched_directories()) or "(none)"
    where = f"a folder `{top}/` (or a file `{top}.py`)"
    of = "" if missing == module_name else f" (of {module_name!r})"
    return (
        f"{label}: no module {missing!r}{of}. Python looked for {where} in the current "
        f"directory and PYTHONPATH ({looked}) and in the installed packages. Run ascent from the directory "
        f"that holds `{top}/`, add that directory to PYTHONPATH, or check the spelling of the import path."
    )


def searched_directories() -> list[str]:
    """The directories of sys.path a user's package could sit in: not the standard library nor
    site-packages."""
    paths = sysconfig.get_paths()
    skip = tuple(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)
    out = []
    for entry in sys.path:
        p = str(Path(entry or os.getcwd()).resolve())
        inside = any(p == s or p.startswith(s + os.sep) for s in skip)
        if inside or "site-packages" in p or p.endswith(".zip") or p in out:
            continue
        if Path(p).is_dir():
            out.append(p)
    return out


def _missing_attribute(module: ModuleType, attr: str, label: str) -> str:
    file = getattr(module, "__file__", None) or "no file"
    return (
        f"{label}: module {module.__name__!r} has no attribute {attr!r} (read {file}); its public callables: "
        f"{_callables(module)}. Check the name after the colon."
    )


def _where(module: ModuleType) -> str:
    file = getattr(module, "__file__", None)
    return f"module {module.__name__!r} ({file})" if file else f"module {module.__name__!r}"


def _callables(module: ModuleType) -> str:
    names = sorted(
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__
    )  # defined in the module, not imported into it
    return ", ".join(names) if names else "none"
