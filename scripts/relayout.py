"""One-shot: rewrite `prohost.<module>` references of the old flat layout to the new one.

The source tree moved to commands/, engine/ and wire/ (see docs/architecture.md).
A branch started before that move can be brought over with::

    python scripts/relayout.py FILE...

It rewrites imports (`from prohost import x, y` too), module paths in strings and
docs (`prohost.harness`, `prohost/harness.py`), and leaves logger names alone
(`getLogger("prohost.harness")`, caplog filters): those stay as users know them.
Delete this script once no branch from before the move is left.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: Old module name (under prohost) → its new dotted path (under prohost).
MOVES = {
    # commands: one thin front-end per subcommand
    "agent": "commands.agent",
    "pair": "commands.pair",
    "sendcmd": "commands.send",
    "statuscmd": "commands.status",
    "gc": "commands.gc",
    "demo": "commands.demo",
    "demo_agent": "commands.demo_agent",
    "daemon": "commands.daemon",
    "service": "commands.service",
    # the engine
    "harness": "engine.harness",
    "recovery": "engine.recovery",
    "status_file": "engine.status_file",
    "upkeep": "engine.upkeep",
    "runner": "engine.runner",
    "scheduler": "engine.scheduler",
    "link": "engine.link",
    "heartbeat": "engine.heartbeat",
    "ledger": "engine.ledger",
    "agentproc": "engine.agentproc",
    "procinfo": "engine.procinfo",
    "blocking": "engine.blocking",
    "execute": "engine.execute",
    "brains": "engine.brains",
    "worktrees": "engine.worktrees",
    "collect": "engine.collect",
    "reporter": "engine.reporter",
    "timeline": "engine.timeline",
    "prompt": "engine.prompt",
    "snapshot": "engine.snapshot",
    "panel": "engine.panel",
    "termout": "engine.termout",
    "signals": "engine.signals",
    "accounts": "engine.accounts",
    "limits": "engine.limits",
    # the wire
    "protocol": "wire.protocol",
    "runs": "wire.runs",
    "signature": "wire.signature",
    "intake": "wire.intake",
}

_NAMES = "|".join(sorted(map(re.escape, MOVES), key=len, reverse=True))
_DOTTED = re.compile(rf"(?<![.\w])prohost\.({_NAMES})(?![A-Za-z0-9_])")
_PATH = re.compile(rf"(?<![.\w])prohost/({_NAMES})(?=\.py\b|/)")
_FROM = re.compile(r"^(\s*)from prohost import (.+?)\s*$")
#: Lines naming a logger: left alone (log names are user-visible and stay stable).
_LOGGER_LINE = re.compile(
    r"getLogger\(|caplog|LogRecord\(|record\.name|\.name ==|in err\b|logger="
    r"|log(?:s)? under"
)


def _rewrite_from(indent: str, names: str) -> str:
    kept: list[str] = []
    moved: list[str] = []
    for item in (part.strip() for part in names.split(",")):
        name = item.split(" as ")[0].strip()
        if name in MOVES:
            package, _, module = MOVES[name].rpartition(".")
            moved.append(f"{indent}from prohost.{package} import {module}"
                         + item[len(name):])
        else:
            kept.append(item)
    lines = [f"{indent}from prohost import {', '.join(kept)}"] if kept else []
    return "\n".join(lines + moved)


def rewrite(text: str) -> str:
    """``text`` with every reference to a moved module rewritten (see module doc)."""
    out = []
    for line in text.split("\n"):
        match = _FROM.match(line)
        if match and not match.group(2).startswith("("):
            line = _rewrite_from(match.group(1), match.group(2))
        elif not _LOGGER_LINE.search(line):
            line = _DOTTED.sub(lambda m: "prohost." + MOVES[m.group(1)], line)
            line = _PATH.sub(lambda m: "prohost/" + MOVES[m.group(1)].replace(".", "/"),
                             line)
        out.append(line)
    return "\n".join(out)


def main(paths: list[str]) -> int:
    for raw in paths:
        path = Path(raw)
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            path.write_text(new)
            print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
