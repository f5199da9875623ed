"""Each part of the harness is handed only the ledger steps it uses (issue 39, point 4).

``prohost/engine/ledger/interfaces.py`` names one protocol per consumer of
:class:`LedgerSteps`; ``mypy --strict`` checks that each consumer calls nothing
else and that :class:`LedgerSteps` satisfies each. What mypy cannot see is kept
here, by reading the consumers' code: a protocol that names a step its consumer
never calls (an interface wider than its use), a protocol nobody is typed with,
and a step of :class:`LedgerSteps` that no part is given.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Protocol

import prohost
from prohost.engine.ledger import interfaces
from prohost.engine.ledger.steps import LedgerSteps

ROOT = Path(prohost.__file__).parent

#: Each protocol, and the module whose code is typed with it (upkeep.py has two:
#: its ``prune``, which recovery also calls, and its ``DailyPass``).
CONSUMERS: dict[type, str] = {
    interfaces.AdmissionSteps: "engine/supervisor/admission.py",
    interfaces.RecoverySteps: "engine/supervisor/recovery.py",
    interfaces.PruneSteps: "engine/supervisor/upkeep.py",
    interfaces.DailySteps: "engine/supervisor/upkeep.py",
    interfaces.OutboxSteps: "engine/report/outbox.py",
    interfaces.AttemptSteps: "engine/run/attempts.py",
    interfaces.RunSteps: "engine/run/runner.py",
}

#: The harness makes the steps and keeps the concrete class for its own three.
MAKER = "engine/harness.py"


def steps_used(module: str) -> set[str]:
    """The names the module's code reads off its ledger steps: ``steps.X`` and
    ``self.steps.X``."""
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    used: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "steps") or (
                isinstance(owner, ast.Attribute) and owner.attr == "steps"
                and isinstance(owner.value, ast.Name) and owner.value.id == "self"):
            used.add(node.attr)
    return used


def members(protocol: type) -> set[str]:
    """A protocol's methods, its bases' included."""
    return {name for klass in protocol.__mro__ if klass not in (Protocol, object)
            for name, value in vars(klass).items()
            if not name.startswith("_") and callable(value)}


def own_members(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items()
            if not name.startswith("_") and callable(value)}


def protocols() -> list[type]:
    return [value for _, value in inspect.getmembers(interfaces, inspect.isclass)
            if value.__module__ == interfaces.__name__]


def test_each_protocol_is_exactly_what_its_consumer_calls() -> None:
    for protocol, module in CONSUMERS.items():
        used = steps_used(module)
        named = set().union(*(members(p) for p, m in CONSUMERS.items() if m == module))
        assert used <= named, (
            f"{module} calls {sorted(used - named)}, which "
            f"{protocol.__name__} does not name")
        # A base's steps may be there for a part the consumer hands its steps to
        # (Recovery's prune, through upkeep.prune); its own must all be called.
        assert own_members(protocol) <= used, (
            f"{protocol.__name__} names {sorted(own_members(protocol) - used)}, which "
            f"{module} never calls: narrow it")
        source = (ROOT / module).read_text(encoding="utf-8")
        assert f"steps: {protocol.__name__}" in source, (
            f"{module} is not typed with {protocol.__name__}")


def test_every_protocol_has_a_consumer() -> None:
    assert set(protocols()) == set(CONSUMERS)


def test_together_they_are_the_whole_of_the_steps() -> None:
    """Every public step of :class:`LedgerSteps` is given to some part (or is the
    harness's own), and none is named that it lacks."""
    public = {name for name, value in vars(LedgerSteps).items()
              if not name.startswith("_") and callable(value)}
    given = set().union(*(members(p) for p in CONSUMERS))
    own = steps_used(MAKER)
    assert given | own == public, (
        f"steps no part uses: {sorted(public - given - own)}; "
        f"named but missing: {sorted((given | own) - public)}")
    assert own == {"writer", "cancelled", "save_limits"}
