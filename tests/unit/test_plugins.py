"""The plug-in loader (`ascent.plugins`): user code resolves from the current directory, and every way an
import path can be wrong says where Python looked and what to change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascent.algorithms import POLICY_LOSSES
from ascent.plugins import PluginError, add_plugin_root, load_plugin, resolve, split_import_path

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory holds a user package `plugpkg_t/` (a unique name: sys.modules outlives a
    test)."""
    pkg = tmp_path / "plugpkg_t"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "losses.py").write_text(
        "import os\nLIMIT = 3\n\ndef my_loss(x):\n    return x\n\nclass Scorer:\n    pass\n"
    )
    (pkg / "broken.py").write_text("import not_installed_dep_xyz\n")
    (pkg / "raises.py").write_text("raise RuntimeError('boom at import')\n")
    (pkg / "exits.py").write_text("import sys\nsys.exit(3)\n")
    (pkg / "os_exits.py").write_text("import os\nprint('leaving now')\nos._exit(0)\n\ndef f():\n    pass\n")
    (pkg / "kills.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("plugpkg_t")]:
        del sys.modules[name]


def test_user_code_resolves_from_the_current_directory_and_reaches_child_processes(project: Path) -> None:
    assert load_plugin("plugpkg_t.losses:my_loss", "algorithm.policy_loss")(5) == 5
    assert sys.path[0] == str(project.resolve())
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(project.resolve()), "/somewhere/else"]
    add_plugin_root()  # once: neither list grows
    assert sys.path.count(str(project.resolve())) == 1 and os.environ["PYTHONPATH"].count(str(project)) == 1


def test_a_missing_module_names_the_directories_searched_and_the_fix(project: Path) -> None:
    with pytest.raises(PluginError) as err:
        load_plugin("nopkg_q.rewards:score", "reward.fn")
    msg = str(err.value)
    assert msg.startswith("reward.fn='nopkg_q.rewards:score': no module 'nopkg_q' (of 'nopkg_q.rewards')")
    assert str(project.resolve()) in msg and "site-packages" not in msg
    assert "directory that holds `nopkg_q/`" in msg and "PYTHONPATH" in msg and "spelling" in msg


def test_a_missing_attribute_lists_the_module_s_public_callables(project: Path) -> None:
    with pytest.raises(
        PluginError, match=r"has no attribute 'my_los' .*its public callables: Scorer, my_loss\."
    ):
        load_plugin("plugpkg_t.losses:my_los", "algorithm.policy_loss")
    with pytest.raises(PluginError, match=r"LIMIT in module 'plugpkg_t.losses' .* is a int, not callable"):
        load_plugin("plugpkg_t.losses:LIMIT", "algorithm.policy_loss")


def test_a_module_that_fails_to_import_says_why(project: Path) -> None:
    with pytest.raises(PluginError, match="it imports 'not_installed_dep_xyz', which is not installed"):
        load_plugin("plugpkg_t.broken:f", "rollout.env")
    with pytest.raises(PluginError, match="importing 'plugpkg_t.raises' raised RuntimeError: boom at import"):
        load_plugin("plugpkg_t.raises:f", "rollout.env")


def test_a_module_that_calls_sys_exit_at_import_says_so(project: Path) -> None:
    # before: SystemExit went through, and `ascent train` ended with status 3 and no message at all
    with pytest.raises(
        PluginError, match=r"importing 'plugpkg_t.exits' called sys.exit\(3\); fix the module"
    ):
        load_plugin("plugpkg_t.exits:f", "reward.fn")


def load_in_a_child(project: Path, spec: str, field: str) -> subprocess.CompletedProcess[str]:
    """`load_plugin(spec, field)` in a fresh interpreter in `project`: a module that ends its process at
    import ends that interpreter, not pytest (which it would end with status 0, its tests unreported)."""
    code = f"from ascent.plugins import load_plugin; load_plugin({spec!r}, {field!r})"
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_module_that_ends_its_process_at_import_is_a_plugin_error(project: Path) -> None:
    # before: os._exit(0) at import ended the process that loaded it (`ascent train`) with status 0, silently
    proc = load_in_a_child(project, "plugpkg_t.os_exits:f", "reward.fn")
    assert proc.returncode == 1 and "PluginError: reward.fn='plugpkg_t.os_exits:f': importing " in proc.stderr
    assert (
        "'plugpkg_t.os_exits' ended its process (exit status 0) before the import returned; its last output: "
        "'leaving now'. Fix the module: a module ascent imports must not end its process" in proc.stderr
    )
    proc = load_in_a_child(project, "plugpkg_t.kills:f", "rollout.source.env")
    assert proc.returncode == 1, proc.stderr
    assert "importing 'plugpkg_t.kills' ended its process (killed by SIGKILL)" in proc.stderr


def test_a_module_that_imports_in_a_probe_is_imported_here_once_after(project: Path) -> None:
    (project / "plugpkg_t" / "counts.py").write_text(
        "import os\nwith open('imports.txt', 'a') as f:\n    f.write(f'{os.getpid()}\\n')\n\ndef f():\n    pass\n"
    )
    load_plugin("plugpkg_t.counts:f", "reward.fn")
    load_plugin("plugpkg_t.counts:f", "reward.fn")
    pids = (project / "imports.txt").read_text().split()
    assert len(pids) == 2 and pids[1] == str(os.getpid()) != pids[0]  # the probe's, then this process's


def test_malformed_paths_show_the_form() -> None:
    for bad in ("pkg.mod", "pkg.mod:", ":fn", "a:b:c"):
        with pytest.raises(PluginError, match=r"not an import path; write it as `pkg.module:name`"):
            split_import_path(bad, "rollout.agent")


def test_loss_and_advantage_paths_name_their_field_and_the_fix(project: Path) -> None:
    assert resolve(POLICY_LOSSES, "plugpkg_t.losses:my_loss", "algorithm.policy_loss")(1) == 1
    with pytest.raises(
        ValueError, match=r"^algorithm.policy_loss='nopkg_q:f': no module 'nopkg_q'.*Run ascent"
    ):
        resolve(POLICY_LOSSES, "nopkg_q:f", "algorithm.policy_loss")
    with pytest.raises(ValueError, match=r"^algorithm.policy_loss='ppo2': not a known name; choose one of"):
        resolve(POLICY_LOSSES, "ppo2", "algorithm.policy_loss")
