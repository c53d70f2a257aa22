"""The import rules of design.md ("Package map" and "Import rules"), read from the source with `ast`.

Every `import` of every module under ascent/ counts: at the top, inside functions (deferred imports still
tie one package to another) and under `if TYPE_CHECKING:`. A type-only import creates no cycle at run time,
but the rules are about the design: a package that names another's types depends on it, so it counts here
too. A package is the first level under `ascent` (`ascent.orchestrator`, or a top-level module such as
`ascent.errors` or `ascent.cli`).

The layers below are the package map's order as the code has it: a package imports only packages of lower
layers, never one of its own layer or above. `data` sits above `envs` (SFT rows reuse the env's chat
tokenization); `rollout` sits above `envs` too: its HTTP server renders chat templates and parses tool calls
with the envs' own `envs.chat` and `envs.tools.calls`, so an agent's endpoint and a training env read a
conversation the same way; `transport` sits above `cluster`: a weight publisher calls the trainer and rollout
worker groups through their typed handles. Layers also make the package graph acyclic; the cycle tests say so
directly, with the imports that close a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "ascent"

LAYERS: list[set[str]] = [
    {"errors", ""},  # "": ascent/__init__.py, which imports nothing from ascent
    {"plugins", "messages", "config"},  # leaves: the shared loader, the frozen messages, typed config
    {"algorithms", "models", "envs", "rewards", "tracking"},
    {"data", "rollout", "trainer", "cluster"},
    {"transport"},  # a publisher drives the worker groups' handles (cluster.base)
    {"orchestrator"},
    {"doctor", "studio"},
    {"entrypoints"},
    {"cli"},
    {"__main__"},
]
LEAVES = {"errors", "plugins"}  # import nothing that could import back; any package may use them
ALLOWED: dict[str, set[str]] = {  # design.md's own lists (plus the leaves); an empty set: nothing from ascent
    "errors": set(),
    "plugins": {"errors"},
    "config": {"errors"},  # errors: the leaf under every package
    "messages": set(),
    "algorithms": set(),
    "envs": {"messages"} | LEAVES,
    "rewards": {"messages"} | LEAVES,
    "studio": {"tracking", "config"} | LEAVES,
    "": set(),  # ascent/__init__.py
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, e.g. ascent.cli
    target: str  # the imported ascent module (a submodule where `from pkg import sub` names one)
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.text}"


def package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@cache
def module_files() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """Every import of an ascent module anywhere in the file (ast.walk reaches function bodies and
    `if TYPE_CHECKING:` blocks alike)."""
    source = path.read_text()
    lines = source.splitlines()
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        text = " ".join(lines[node.lineno - 1 : node.end_lineno])
        for name in dict.fromkeys(names):
            if name == "ascent" or name.startswith("ascent."):
                yield Import(module, name, node.lineno, " ".join(text.split()))


@cache
def all_imports() -> list[Import]:
    modules = module_files()
    return [imp for module, path in modules.items() for imp in imports_of(module, path, modules)]


def cross_package(imports: list[Import]) -> list[Import]:
    return [i for i in imports if package(i.source) != package(i.target)]


def cycles(edges: list[tuple[str, str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component, member = set(), ""
            while member != node:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_every_package_has_a_layer() -> None:
    layered = set().union(*LAYERS)
    packages = {package(m) for m in module_files()}
    assert packages <= layered, f"add these packages to LAYERS: {sorted(packages - layered)}"
    assert sum(map(len, LAYERS)) == len(layered), "a package sits in two layers"


def test_the_packages_design_md_names_import_only_what_it_allows() -> None:
    bad = [
        str(i)
        for i in cross_package(all_imports())
        if package(i.source) in ALLOWED and package(i.target) not in ALLOWED[package(i.source)]
    ]
    assert not bad, "imports design.md forbids (see ALLOWED):\n" + "\n".join(bad)


def test_a_package_imports_only_lower_layers() -> None:
    layer = {name: n for n, names in enumerate(LAYERS) for name in names}
    bad = [
        f"{i}   ({package(i.source)} in layer {layer[package(i.source)]}, "
        f"{package(i.target)} in layer {layer[package(i.target)]})"
        for i in cross_package(all_imports())
        if package(i.source) in layer and layer[package(i.target)] >= layer[package(i.source)]
    ]
    assert not bad, "imports of a package of the same or a higher layer:\n" + "\n".join(bad)


def test_no_two_packages_import_each_other() -> None:
    imports = cross_package(all_imports())
    for component in cycles([(package(i.source), package(i.target)) for i in imports]):
        closing = [str(i) for i in imports if {package(i.source), package(i.target)} <= component]
        raise AssertionError(f"packages {sorted(component)} import each other:\n" + "\n".join(closing))


def test_no_modules_of_different_packages_import_each_other() -> None:
    imports = all_imports()
    for component in cycles([(i.source, i.target) for i in imports]):
        if len({package(m) for m in component}) > 1:
            closing = [str(i) for i in imports if i.source in component and i.target in component]
            raise AssertionError("a cycle of modules across packages:\n" + "\n".join(closing))


def imports_in_functions(path: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    for function in ast.walk(parsed(path)):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    yield node


def is_ours(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").startswith("ascent")
    return any(alias.name.startswith("ascent") for alias in node.names)


def test_an_import_of_ours_inside_a_function_says_why() -> None:
    """design.md: imports sit at the top; one deferred on purpose (torch, Ray, triton, an optional tracker)
    says so in a comment on its line or the line above."""
    bad = []
    for module, path in module_files().items():
        lines = path.read_text().splitlines()
        for node in imports_in_functions(path):
            said = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
            if is_ours(node) and not said:
                bad.append(f"{module}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    why = "move these imports to the top, or say why they wait (# deferred: ...):\n"
    assert not bad, why + "\n".join(sorted(set(bad)))


def test_the_reader_sees_the_imports_it_checks() -> None:
    """The parser finds top-level, in-function, TYPE_CHECKING and relative imports, and names submodules."""
    imports = all_imports()
    assert any(i.source == "ascent.cli" and i.target == "ascent.entrypoints.train" for i in imports)
    assert any(i.source == "ascent.data.builders" and i.target == "ascent.config.schema" for i in imports)
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [{"a", "b", "c"}]
