"""The package's import graph has no cycle: every `lockstep.*` import in every module under
src/lockstep (those inside functions included, which only hide a cycle) is an edge, and the
graph must be acyclic. A cycle means two modules each need the other: the shared names belong
in a third module both can import."""

from __future__ import annotations

import ast
from pathlib import Path

import lockstep

SRC = Path(lockstep.__file__).resolve().parent


def module_name(path: Path, src: Path = SRC) -> str:
    parts = ["lockstep", *path.relative_to(src).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the lockstep modules it imports: `import lockstep.x` and `from lockstep.x import
    name` are edges to lockstep.x; `from lockstep.x import y` where y is a module is an edge to
    lockstep.x.y alone (a package's own __init__ runs first for any of its modules, which is not
    counted: every package importing its modules would be a cycle)."""
    paths = {module_name(p, src): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            for t in targets:
                if t in paths and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 100  # every module was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_inside_a_function_is_found(tmp_path):
    """Negative control: a two-module cycle hidden in a function-level import fails the check."""
    pkg = tmp_path / "lockstep"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from lockstep.sub.b import thing\n")
    (pkg / "sub" / "b.py").write_text("def thing():\n    from . import a\n    return a\n")
    graph = import_graph(pkg)
    assert graph["lockstep.sub.a"] == {"lockstep.sub.b"} and graph["lockstep.sub.b"] == {"lockstep.sub.a"}
    assert find_cycle(graph) == ["lockstep.sub.a", "lockstep.sub.b", "lockstep.sub.a"]
