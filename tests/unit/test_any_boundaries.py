"""design.md's seams are typed: no public function takes or returns a bare `Any` that another package calls.

An approximation read with `ast` (no type inference), honest about what it sees:
- **Offender**: a public function or method (no leading underscore; `__init__` counts, a method of a private
  class does not) with a named parameter or its return annotated `Any` itself (`Any`, `Any | None`,
  `Optional[Any]`). Containers of `Any` (`dict[str, Any]`: metrics, JSON, rows) and `*args: Any` /
  `**kwargs: Any` (forwarders) are left alone: the seam there is the container or the forwarded call.
- **Across a boundary**: a module of another package refers to it: by name (`from ascent.x.y import f`,
  re-exports of a package's `__init__` followed), as an attribute of an imported module (`y.f`), as a typed
  handle or class attribute (`C.m`), or, for a method, by importing its class and naming `.m` anywhere in
  the module (an instance's call `obj.m(...)` when the class is imported; one reached through an object whose
  class that module never imports is not seen).

Offenders that remain are listed in ALLOWED with the reason each keeps `Any`; the test fails on a new one and
on an entry that no longer offends (take it off the list).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from tests.unit.test_import_rules import module_files, package, parsed

# (module, qualified name): why it still takes or returns Any. Keep each reason one line.
ALLOWED: dict[tuple[str, str], str] = {
    # transformers' objects: typing the tokenizer as PreTrainedTokenizerBase makes `tokenizer.decode` a
    # `str | list[str]` where the loop's `Decode` wants a str (entrypoints.evaluate, rollout): a typed decode
    # wrapper first, then these
    ("ascent.models.loading", "load_tokenizer"): "returns a transformers tokenizer of the family's class",
    (
        "ascent.models.loading",
        "load_model",
    ): "returns the family's transformers model class (or a PEFT wrapper)",
    ("ascent.models.loading", "cache_kwarg"): "a transformers model, a PEFT or torch.compile wrapper of one",
    # genuinely anything
    ("ascent.plugins", "load_plugin"): "the user's object (a function, a class); its caller checks its kind",
    # a config section below the orchestrator (design.md wants flat arguments): a tracking spec is its own change
    ("ascent.tracking.sinks", "open_tracking"): "`tracking`: the TrackingConfig section, read by attribute",
}


@dataclass(frozen=True)
class Offender:
    module: str
    name: str  # `f` or `Class.method`
    line: int
    params: tuple[str, ...]  # the parameters annotated Any ("return" for the return annotation)

    def __str__(self) -> str:
        return f"{self.module}:{self.line} {self.name}({', '.join(self.params)})"


def is_any(node: ast.expr | None) -> bool:
    """`Any`, `typing.Any`, `"Any"`, `Any | None`, `Optional[Any]`."""
    if isinstance(node, ast.Name | ast.Attribute):
        return (node.id if isinstance(node, ast.Name) else node.attr) == "Any"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return is_any(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return is_any(node.left) or is_any(node.right)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Optional":
        return is_any(node.slice)
    return False


def public_functions(body: list[ast.stmt], owner: str = "") -> Iterator[tuple[str, ast.FunctionDef]]:
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not node.name.startswith("_") or node.name == "__init__":
                yield (f"{owner}.{node.name}" if owner else node.name), node  # type: ignore[misc]
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_") and not owner:
            yield from public_functions(node.body, node.name)


@cache
def offenders() -> dict[tuple[str, str], Offender]:
    found = {}
    for module, path in module_files().items():
        for name, fn in public_functions(parsed(path).body):
            a = fn.args
            params = [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs] if is_any(p.annotation)]
            params += ["return"] if is_any(fn.returns) else []
            if params:
                found[(module, name)] = Offender(module, name, fn.lineno, tuple(params))
    return found


@cache
def top_level_names(module: str) -> frozenset[str]:
    body = parsed(module_files()[module]).body
    return frozenset(
        n.name for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    )


def absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    here = module.split(".") if module_files()[module].name == "__init__.py" else module.split(".")[:-1]
    base = here[: len(here) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def resolve(module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
    """Where `name`, as `module` has it, is defined: (module, name), following `from x import name`."""
    if module not in module_files() or depth > 8:
        return None
    if name in top_level_names(module):
        return module, name
    for node in parsed(module_files()[module]).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return resolve(absolute(module, node), alias.name, depth + 1)
    return None


@cache
def nodes(module: str) -> tuple[list[ast.Import | ast.ImportFrom], list[ast.Attribute]]:
    """The module's imports and attribute accesses, from one walk of its tree."""
    imports: list[ast.Import | ast.ImportFrom] = []
    attributes: list[ast.Attribute] = []
    for node in ast.walk(parsed(module_files()[module])):
        if isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(node)
        elif isinstance(node, ast.Attribute):
            attributes.append(node)
    return imports, attributes


def bindings(module: str) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """The module's names for other ascent modules, and for functions and classes of other modules."""
    modules, symbols = {}, {}
    for node in nodes(module)[0]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in module_files():
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = absolute(module, node)
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{source}.{alias.name}" in module_files():
                    modules[local] = f"{source}.{alias.name}"
                elif (target := resolve(source, alias.name)) is not None:
                    symbols[local] = target
    return modules, symbols


def references(module: str) -> set[tuple[str, str]]:
    """(module, qualified name) of every function, class and method of another module this module names."""
    modules, symbols = bindings(module)
    found = set(symbols.values())
    attributes = set()
    for node in nodes(module)[1]:
        attributes.add(node.attr)
        if isinstance(node.value, ast.Name) and node.value.id in modules:
            target = resolve(modules[node.value.id], node.attr)
            found |= {target} if target is not None else set()
    classes = {target for target in found if target[1] in top_level_names(target[0])}
    found |= {(m, f"{c}.{attr}") for m, c in classes for attr in attributes}  # C.m, or obj.m with C imported
    return found


@cache
def callers() -> dict[tuple[str, str], set[str]]:
    """(module, qualified name) -> the packages, other than its own, whose modules refer to it."""
    out: dict[tuple[str, str], set[str]] = {}
    for module in module_files():
        for target in references(module):
            if package(target[0]) != package(module):
                out.setdefault(target, set()).add(package(module))
    return out


def crossing() -> dict[tuple[str, str], Offender]:
    return {key: o for key, o in offenders().items() if key in callers()}


def test_no_function_another_package_calls_takes_or_returns_any() -> None:
    new = [
        f"{o}   called from {', '.join(sorted(callers()[k]))}"
        for k, o in crossing().items()
        if k not in ALLOWED
    ]
    assert not new, (
        "public functions other packages call take or return a bare Any; give them the concrete type (or, "
        "if there is none yet, add them to ALLOWED with the reason):\n" + "\n".join(sorted(new))
    )


def test_the_allow_list_holds_only_offenders() -> None:
    gone = sorted(f"{m}.{n}" for m, n in ALLOWED if (m, n) not in crossing())
    assert not gone, "these no longer take or return Any across a package boundary; remove them: " + str(gone)


def test_the_reader_sees_annotations_and_callers() -> None:
    """The check finds what it claims to: bare Any (not containers of it), re-exported and module-attribute
    references, and an instance's method through its imported class."""
    sig = ast.parse(
        "def f(a: Any, b: dict[str, Any], c: 'Any | None', *d: Any, **e: Any) -> Optional[Any]: ..."
    )
    fn = sig.body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert [p.arg for p in fn.args.args if is_any(p.annotation)] == ["a", "c"] and is_any(fn.returns)
    assert ("ascent.tracking.timeline", "Timeline") in references("ascent.entrypoints.train")  # via __init__
    assert ("ascent.orchestrator.rundir", "open_run_dir") in references(
        "ascent.entrypoints.train"
    )  # rundir.x
    assert ("ascent.cluster.base", "WorkerGroup.call_split") in references("ascent.orchestrator.loop")
    assert resolve("ascent.tracking", "Timeline") == ("ascent.tracking.timeline", "Timeline")
