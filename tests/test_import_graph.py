"""The shape of the tree (docs/architecture.md, "Rooms"): no import cycle among
prohost's modules, imports made only for type checking included, no module over 450
lines, and only the composition root (and the command front-ends) knows ``Harness``.

A small AST walk, no new dependency: a cycle is what makes a part impossible to
read, test or import alone, and ``if TYPE_CHECKING:`` hides it from Python but not
from the reader.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "prohost"
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The prohost modules ``name`` imports anywhere in its text (functions and
    ``TYPE_CHECKING`` blocks included), each as the longest dotted name that exists."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            candidates = [f"{target}.{alias.name}" for alias in node.names] or [target]
            candidates = [c if c in modules else target for c in candidates]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                yield candidate


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: set(_imported(name, path, modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle_among_prohost_modules() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (pass each part what it uses instead):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_sees_an_import_made_only_for_type_checking(tmp_path: Path) -> None:
    # The check itself: two modules that import each other, one of them only under
    # TYPE_CHECKING, are a cycle.
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert _cycles(graph) == [["a", "b"]]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from prohost.x import Y\n"
    path = tmp_path / "m.py"
    path.write_text(source)
    assert list(_imported("prohost.m", path, {"prohost.m": path, "prohost.x": path})) == [
        "prohost.x"]


def test_no_module_is_over_450_lines() -> None:
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them at a real seam): {long}"


def test_only_the_composition_root_knows_the_harness() -> None:
    modules = _modules()
    knowing = sorted(
        name for name, path in modules.items()
        if name != "prohost.engine.harness" and not name.startswith("prohost.commands")
        and "prohost.engine.harness" in set(_imported(name, path, modules)))
    assert not knowing, f"these import the Harness; hand them what they use instead: {knowing}"


def test_no_module_imports_the_runner_for_its_logger() -> None:
    # Loggers are named in prohost.engine.lognames (or by string), so that a module
    # that only logs a run's progress does not depend on the runner.
    modules = _modules()
    runner = "prohost.engine.run.runner"
    users = sorted(name for name, path in modules.items()
                   if runner in set(_imported(name, path, modules)))
    assert users == ["prohost.engine.harness"], users
