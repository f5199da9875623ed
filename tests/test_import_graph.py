"""The house rules of the tree (docs/architecture.md, "Rooms"), as tests: which room
may import which, written once in :data:`ROOMS`; no import cycle among prohost's
modules; only the composition root (and the command front-ends) knows
``Harness``; no module imports the runner for its logger; and an alarm for a
module grown past 800 lines.

Every import counts, wherever it is written: at module level, inside a function
(``import`` there is still an arrow, only a later one), or under
``if TYPE_CHECKING:`` (hidden from Python, not from the reader). A small AST walk,
no new dependency.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

PACKAGE = Path(__file__).resolve().parent.parent / "prohost"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

#: A room is a name and the modules it holds, as paths under ``prohost/``: a folder
#: (``engine/run/``, everything in it) or one file (``engine/harness.py``).
Room = tuple[str, tuple[str, ...]]

#: Which room may import which, top to bottom. A module may import any module of its
#: own room and of the rooms on the lines below its own; rooms on one line are peers,
#: which import neither each other nor anything above. docs/architecture.md shows
#: this same list (checked below: :func:`test_the_architecture_page_shows_the_room_order`).
ROOMS: tuple[tuple[Room, ...], ...] = (
    (("command line", ("__main__.py", "cli.py", "cli_handlers.py")),),
    (("commands", ("commands/",)),),
    (("composition root", ("engine/harness.py",)),),
    (("supervisor", ("engine/supervisor/",)),),
    (("view", ("engine/view/",)),),
    (("run", ("engine/run/",)), ("lanes", ("engine/lanes/",)), ("link", ("engine/link/",))),
    (("report", ("engine/report/",)),),
    (("agent", ("engine/agent/",)), ("ledger", ("engine/ledger/",))),
    (("repos", ("engine/repos/",)), ("accounts", ("engine/accounts/",)),
     ("sandbox", ("engine/sandbox/",))),
    (("engine base", ("engine/__init__.py", "engine/blocking.py", "engine/changes.py",
                      "engine/lognames.py", "engine/retention.py",
                      "engine/signals.py")),),
    (("process base", ("options.py", "execline.py", "repospec.py", "home.py", "logfile.py",
                       "login_env.py", "startchecks.py")),
     ("server", ("server/",))),
    (("wire", ("wire/",)),),
    (("base", ("__init__.py", "errors.py", "files.py", "invocation.py")),),
)

#: A module this long is worth a look (size alone is no reason to split one).
LINES_ALARM = 800


@attrs.frozen
class Import:
    """One ``import`` or ``from … import`` of a prohost module by another."""

    source: str
    path: Path
    line: int
    #: ``at module level``, ``inside a function`` or ``under TYPE_CHECKING``.
    where: str
    target: str

    def __str__(self) -> str:
        return (f"{self.path.relative_to(PACKAGE.parent)}:{self.line} ({self.where}) "
                f"imports {self.target}")


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


class _Finder(ast.NodeVisitor):
    """The import statements of one module, each with where it is written."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, str]] = []
        self._where = ["at module level"]

    def _within(self, node: ast.AST, where: str) -> None:
        self._where.append(where)
        self.generic_visit(node)
        self._where.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._within(node, "inside a function")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._within(node, "inside a function")

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            self._where.append("under TYPE_CHECKING")
            for child in node.body:
                self.visit(child)
            self._where.pop()
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._where[-1]))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self._where[-1]))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """The prohost modules ``name`` imports anywhere in its text, each as the longest
    dotted name that exists."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    finder = _Finder()
    finder.visit(ast.parse(path.read_text(), str(path)))
    for node, where in finder.found:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            candidates = [f"{target}.{alias.name}" for alias in node.names] or [target]
            candidates = [c if c in modules else target for c in candidates]
        else:
            candidates = [alias.name for alias in node.names]
        for candidate in dict.fromkeys(candidates):
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                yield Import(name, path, node.lineno, where, candidate)


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    return {found.target for found in _imports(name, path, modules)}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def _all_imports() -> list[Import]:
    modules = _modules()
    return [found for name, path in modules.items() for found in _imports(name, path, modules)]


def _room_of(module: str, rooms: tuple[tuple[Room, ...], ...]) -> tuple[int, str]:
    """The level (0 at the top) and the room that hold ``module``."""
    path = _modules()[module].relative_to(PACKAGE).as_posix()
    for level, peers in enumerate(rooms):
        for room, members in peers:
            if any(path == m or (m.endswith("/") and path.startswith(m)) for m in members):
                return level, room
    raise LookupError(f"prohost/{path} is in no room: give it one in ROOMS (and in "
                      f"docs/architecture.md)")


def _breaks(found: Import, rooms: tuple[tuple[Room, ...], ...]) -> str | None:
    """Which rule ``found`` breaks, in words; ``None`` when the room order allows it."""
    level, room = _room_of(found.source, rooms)
    target_level, target_room = _room_of(found.target, rooms)
    if room == target_room or target_level > level:
        return None
    if target_level == level:
        return f"{room} and {target_room} are peers: neither imports the other"
    return f"{room} may not import {target_room}, which is above it"


def _violations(imports: Iterable[Import], rooms: tuple[tuple[Room, ...], ...]) -> list[str]:
    return [f"{found}: {rule}" for found in imports
            if (rule := _breaks(found, rooms)) is not None]


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


# --------------------------------------------------------------------------- the room order


def test_every_import_follows_the_room_order() -> None:
    broken = _violations(_all_imports(), ROOMS)
    assert not broken, (
        "imports against the room order (tests/test_import_graph.py ROOMS, "
        "docs/architecture.md \"Rooms\"); hand the part what it uses, or move the "
        "fact to the room that owns it:\n" + "\n".join(broken))


def test_every_module_has_a_room() -> None:
    for name in _modules():
        _room_of(name, ROOMS)  # raises, naming the module, for one in no room
    members = [m for peers in ROOMS for _, ms in peers for m in ms]
    assert len(members) == len(set(members)), "a module is in two rooms"
    names = [room for peers in ROOMS for room, _ in peers]
    assert len(names) == len(set(names)), "two rooms of one name"
    assert all(re.fullmatch(r"[a-z][a-z ]*", name) for name in names)
    for member in members:
        assert (PACKAGE / member).exists(), f"ROOMS names prohost/{member}, which is gone"


def test_the_room_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    # The check itself: a back-arrow at module level, inside a function and under
    # TYPE_CHECKING is each named with its line; an arrow down, or within a room, is not.
    low = tmp_path / "low.py"
    low.write_text(
        "from typing import TYPE_CHECKING\n"
        "from prohost.high import thing\n"
        "from prohost import low2\n"
        "if TYPE_CHECKING:\n"
        "    from prohost.high import Other\n"
        "def later() -> None:\n"
        "    import prohost.high\n")
    modules = {"prohost.low": low, "prohost.low2": low, "prohost.high": low}
    found = list(_imports("prohost.low", low, modules))
    assert [(f.line, f.where, f.target) for f in found] == [
        (2, "at module level", "prohost.high"),
        (3, "at module level", "prohost.low2"),
        (5, "under TYPE_CHECKING", "prohost.high"),
        (7, "inside a function", "prohost.high"),
    ]
    rooms: tuple[tuple[Room, ...], ...] = (
        (("high", ("engine/harness.py",)),), (("low", ("engine/ledger/",)),))
    fake = [attrs.evolve(f, source="prohost.engine.ledger.store",
                         path=PACKAGE / "engine" / "ledger" / "store.py",
                         target="prohost.engine.harness" if f.target == "prohost.high"
                         else "prohost.engine.ledger") for f in found]
    assert _violations(fake, rooms) == [
        f"prohost/engine/ledger/store.py:{line} ({where}) imports prohost.engine.harness: "
        "low may not import high, which is above it"
        for line, where in [(2, "at module level"), (5, "under TYPE_CHECKING"),
                            (7, "inside a function")]]
    peers: tuple[tuple[Room, ...], ...] = (
        (("high", ("engine/harness.py",)), ("low", ("engine/ledger/",))),)
    assert _violations(fake[:1], peers)[0].endswith(
        "low and high are peers: neither imports the other")


def _room_order_table() -> list[str]:
    """The room order as docs/architecture.md shows it."""
    lines = ["| level | room | modules (under `prohost/`) |", "| --- | --- | --- |"]
    for level, peers in enumerate(ROOMS, 1):
        for room, members in peers:
            shown = ", ".join(f"`{member}`" for member in members)
            lines.append(f"| {level} | {room} | {shown} |")
    return lines


def test_the_architecture_page_shows_the_room_order() -> None:
    text = ARCHITECTURE.read_text()
    expected = _room_order_table()
    start = text.find(expected[0])
    shown = text[start:].splitlines()[: len(expected)] if start >= 0 else []
    assert shown == expected, (
        "docs/architecture.md's room order differs from ROOMS; the table should read:\n"
        + "\n".join(expected))


# --------------------------------------------------------------------------- the other rules


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
    assert _imported("prohost.m", path, {"prohost.m": path, "prohost.x": path}) == {"prohost.x"}


def test_no_module_is_over_800_lines() -> None:
    # An alarm, not a rule: past this, look for a second job inside the module.
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > LINES_ALARM}
    assert not long, f"modules over {LINES_ALARM} lines (is a second job inside?): {long}"


def test_only_the_composition_root_knows_the_harness() -> None:
    modules = _modules()
    knowing = sorted(
        name for name, path in modules.items()
        if name != "prohost.engine.harness" and not name.startswith("prohost.commands")
        and "prohost.engine.harness" in _imported(name, path, modules))
    assert not knowing, f"these import the Harness; hand them what they use instead: {knowing}"


def test_no_module_imports_the_runner_for_its_logger() -> None:
    # Loggers are named in prohost.engine.lognames (or by string), so that a module
    # that only logs a run's progress does not depend on the runner.
    modules = _modules()
    runner = "prohost.engine.run.runner"
    users = sorted(name for name, path in modules.items()
                   if runner in _imported(name, path, modules))
    assert users == ["prohost.engine.harness"], users

