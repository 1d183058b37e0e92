"""Layers point one way: the ONNX boundary and the profiles stand alone (they never import
edgefl), and no module of edgefl/, exporters/ or device_profiles/ is part of an import cycle.
An import inside a function counts: a cycle hidden that way still means a name lives in the
wrong module (move the shared piece to a module below both)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("edgefl", "exporters", "device_profiles")


@pytest.mark.parametrize("package", ["exporters", "device_profiles"])
def test_package_does_not_import_edgefl(package):
    code = (
        f"import sys, {package}; "
        "bad = sorted(m for m in sys.modules if m == 'edgefl' or m.startswith('edgefl.')); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages (a package is its
    __init__)."""
    files = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _imported(node: ast.AST, package: str) -> list[str]:
    """The dotted names an import statement may load: `from a.b import c` loads a.b and, if
    c is a module, a.b.c; relative imports resolved against `package`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line of the first such import}, counting every import
    statement wherever it is (module level, inside a function, under TYPE_CHECKING). A
    module's own package and subpackages are not edges: importing a submodule always runs its
    package's __init__ first, and an __init__ lists its submodules."""
    files = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {m: {} for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _imported(node, package):
                target = resolve(name)
                if target is None or target == mod:
                    continue
                if target.startswith(mod + ".") or mod.startswith(target + "."):
                    continue
                graph[mod][target] = min(graph[mod].get(target, node.lineno), node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    """A cycle's modules and the imports between them, each with its file and line."""
    files = _modules()
    edges = [
        f"    {a} -> {b} ({files[a].relative_to(ROOT)}:{graph[a][b]})"
        for a in component
        for b in sorted(graph[a])
        if b in component
    ]
    return "import cycle: " + " <-> ".join(component) + "\n" + "\n".join(edges)


def test_the_check_finds_a_cycle_hidden_in_a_function():
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []
    source = "def f():\n    from edgefl.models.zoo import ZOO\n"
    names = [n for node in ast.walk(ast.parse(source)) for n in _imported(node, "edgefl.models")]
    assert "edgefl.models.zoo" in names


def test_no_module_is_in_an_import_cycle():
    graph = import_graph()
    assert "edgefl.cli" in graph and "exporters" in graph  # the walk found the packages
    found = cycles(graph)
    assert not found, "\n".join(describe(c, graph) for c in found)


def test_no_two_parts_of_edgefl_import_each_other():
    """A subpackage (or top-level module) of edgefl imports another, or is imported by it,
    never both: what both need lives in a part below them."""
    part = {}  # (importing part, imported part) -> an import that makes the edge
    for mod, targets in import_graph().items():
        for target in targets:
            a, b = mod.split("."), target.split(".")
            if a[0] == b[0] == "edgefl" and len(a) > 1 and len(b) > 1 and a[1] != b[1]:
                part.setdefault((a[1], b[1]), f"{mod} -> {target}")
    both = sorted(f"{part[(a, b)]} and {part[(b, a)]}" for a, b in part if (b, a) in part and a < b)
    assert not both, "\n".join(both)
