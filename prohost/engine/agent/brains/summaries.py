"""What a tool call is about, in one line, for the timeline (§8) and heartbeats.

Each CLI describes its tool calls in its own shapes: Claude Code as a tool name
and its JSON arguments, Codex as a typed item. Both come out the same way here:
a short summary (``pytest -q``, a path, a query) and an activity
(``Bash: pytest -q``), with Codex's item types named after Claude's tools so a
thread reads the same whichever agent ran. Pure: no state, no I/O.
"""

from __future__ import annotations

import os
from typing import Any

from prohost.engine.agent.brains.base import one_line
from prohost.execline import split_command

#: A tool argument longer than this many characters is a payload (file content, a
#: prompt), not something that says what the call is about.
_SHORT_ARGUMENT = 200

_FILE_TOOLS = frozenset({"Read", "Write", "Edit", "MultiEdit", "NotebookEdit", "NotebookRead"})

#: Timeline names per Codex item type, kept close to Claude's tool names.
CODEX_TOOL_NAMES = {
    "command_execution": "Bash",
    "file_change": "Edit",
    "mcp_tool_call": "MCP",
    "web_search": "WebSearch",
}


def activity(name: str, summary: str) -> str:
    """What the agent is doing, for heartbeats: ``Bash: pytest -q``, or just the name."""
    return f"{name}: {summary}" if summary else name


def tool_summary(name: str, arguments: Any) -> str:
    """One short line saying what a Claude Code tool call is about (``pytest -q``, a path…)."""
    if not isinstance(arguments, dict):
        return ""

    def text(*keys: str) -> str:
        for key in keys:
            value = arguments.get(key)
            if isinstance(value, str) and value.strip():
                return value
        return ""

    if name == "Bash":
        summary = text("command", "description")
    elif name in _FILE_TOOLS:
        summary = text("file_path", "notebook_path", "path")
    elif name in ("Grep", "Glob"):
        summary = text("pattern")
    elif name == "WebFetch":
        summary = text("url")
    elif name == "WebSearch":
        summary = text("query")
    elif name in ("Task", "Agent"):
        summary = text("description", "subagent_type")
    elif name == "TodoWrite":
        todos = arguments.get("todos")
        count = len(todos) if isinstance(todos, list) else 0
        summary = f"{count} item" if count == 1 else f"{count} items"
    elif name.startswith("mcp__"):
        # mcp__<server>__<tool>: the server is the same for every call of a run,
        # the tool is what tells one call from another.
        tool = name.split("__", 2)[-1]
        argument = _first_string(arguments)
        summary = f"{tool}: {argument}" if argument else tool
    else:
        summary = _first_string(arguments)
    return one_line(summary)


def _first_string(arguments: dict[str, Any]) -> str:
    """The first short, non-empty string argument; else the first string at all."""
    strings = [value for value in arguments.values() if isinstance(value, str) and value.strip()]
    for value in strings:
        if len(value) <= _SHORT_ARGUMENT:
            return value
    return strings[0] if strings else ""


def item_summary(item_type: str, item: dict[str, Any]) -> str:
    """One short line saying what a Codex item (one of :data:`CODEX_TOOL_NAMES`) is about."""
    if item_type == "command_execution":
        command = item.get("command")
        return one_line(_unwrap_shell(command)) if isinstance(command, str) else ""
    if item_type == "mcp_tool_call":
        server, tool = item.get("server"), item.get("tool")
        names = [part for part in (server, tool) if isinstance(part, str) and part]
        return one_line(".".join(names))
    if item_type == "file_change":
        changes = item.get("changes")
        paths = [
            change["path"]
            for change in (changes if isinstance(changes, list) else [])
            if isinstance(change, dict) and isinstance(change.get("path"), str)
        ]
        return one_line(", ".join(paths))
    if item_type == "web_search":
        query = item.get("query")
        if isinstance(query, str) and query.strip():
            return one_line(query)
        # Newer builds start the item before the query is known and describe
        # the search in `action` ({"type":"search","query":…} / open_page's url).
        action = item.get("action")
        if isinstance(action, dict):
            for key in ("query", "url", "pattern"):
                value = action.get(key)
                if isinstance(value, str) and value.strip():
                    return one_line(value)
    return ""


def _unwrap_shell(command: str) -> str:
    """``bash -lc 'pytest -q'`` → ``pytest -q``: the wrapper Codex runs every
    command in says nothing on a timeline."""
    words = split_command(command)
    if (
        len(words) == 3
        and os.path.basename(words[0]) in ("bash", "sh", "zsh")
        and words[1] in ("-c", "-lc")
    ):
        return words[2]
    return command
