"""A fake ``claude`` CLI speaking ``--output-format stream-json --verbose``.

It reads the prompt from stdin and prints events shaped like Claude Code 2.1's,
field for field (including fields prohost does not read), as compact JSON with
raw UTF-8, one per line, the way the CLI's ``JSON.stringify`` does.

The scenario comes from ``FAKE_CLAUDE_SCENARIO`` or ``--fake-scenario NAME``:

reply           init, an assistant text, a successful result with usage and cost
tool            init, a Bash tool_use, its tool_result, a text, the result
is_error        init, the CLI's synthetic "Invalid API key · Please run /login"
                message and a result with ``is_error: true``; exit 1
no_session      with ``--resume``: the CLI's "No conversation found with session ID"
                result (no ``result`` field) and stderr line, exit 1, no init;
                without ``--resume``: like ``reply``. ``FAKE_CLAUDE_REFUSED_COST``
                (dollars) makes that refusal say it spent so much (``total_cost_usd``)
rate_limit      like ``reply`` with a ``rate_limit_event`` in the middle
huge_line       init, one 5 MiB assistant line, then a normal result
noise           like ``tool`` with non-JSON lines between the events
errors_forever  error lines on stderr until killed
lone_surrogate  like ``reply``, the text ending in half an emoji, which the CLI's
                ``JSON.stringify`` writes as the escape ``\\ud83d`` (ES2019)
bad_byte        like ``reply``, the text holding a byte that is not UTF-8 (0xFF)
subagent        like ``reply``, but a subagent (another model) worked too: the
                result's ``usage`` is the main loop's alone while ``modelUsage``
                and ``total_cost_usd`` count every model (``SUBAGENT_MODEL_USAGE``;
                the subagent's own stream events are left out)

Per account, driven by the config folder in ``CLAUDE_CONFIG_DIR`` (what prohost
sets for an account), whatever the scenario:

- a file ``limit`` holding a reset epoch makes this account refuse the work the way
  the CLI does at its usage limit: init, the synthetic ``rate_limit`` assistant
  message ``You've hit your limit · resets 8pm (UTC)``, a ``rate_limit_event`` with
  ``"status":"rejected"`` and that ``resetsAt``, a failed result carrying the same
  text, exit 1. With ``legacy`` after the epoch the text is the older
  ``Claude AI usage limit reached|<epoch>``. With ``spent`` after the epoch the
  limit comes after some work: an assistant text first, and the failed result
  says what that cost (``total_cost_usd``: ``COST``).
- a file ``used_percent`` (a number) adds an ``allowed_warning``
  ``rate_limit_event`` with that utilization right after init.

``FAKE_CLAUDE_REPLY`` replaces the reply text. ``FAKE_CLAUDE_GATE`` is a port on
127.0.0.1: before printing anything, each invocation connects there, says ``start
<run id> <pid>`` and waits for one line (any line) from the test, so a test decides
when each attempt goes on; if the test goes away it exits 3. ``FAKE_CLAUDE_RECORD`` names a
JSON file that gets one entry per invocation (a list): argv, the prompt, selected
environment variables and, for ``--mcp-config``, the config's content and mode.
``--version`` prints a version the way the CLI does.

``--max-budget-usd X`` (its last one) below what a run costs here (``COST``, $0.0342) stops the
run the way the CLI does at its budget: init, the assistant's text, then a result
with ``subtype: "error_max_budget_usd"``, ``is_error: true``, no ``result`` text and
what it spent in ``total_cost_usd`` (the ResultMessage shape of
anthropics/claude-agent-sdk-python); exit 1.

``FAKE_CLAUDE_REFUSE`` names a file: while it exists, every invocation refuses to
start the way the CLI (commander.js) refuses a flag it does not know, before it
prints any event: ``error: unknown option '<the file's content>'`` on stderr, exit
1 (github.com/cline/cline/issues/4566); it is still recorded (FAKE_CLAUDE_RECORD).
A test creates and removes the file to break one turn of a running harness.

``FAKE_AGENT_TOOL`` is a shell command line the fake runs as its Bash tool would,
a child of its own process; what it prints (stripped) is the reply.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import uuid
from typing import Any

from gate_client import announce
from json_lines import BAD_BYTE, LONE_SURROGATE, emit

MODEL = "claude-sonnet-4-5-20250929"
#: What one run costs here (total_cost_usd), in US dollars.
COST = 0.0342
VERSION = "2.1.29"
HUGE_BYTES = 5 * 1024 * 1024
#: The ``subagent`` scenario's ``modelUsage``: the main model's figures grew by the
#: subagent's share, and a second model ran; the costs add up to ``COST``.
SUBAGENT_MODEL_USAGE = {
    MODEL: {"inputTokens": 350, "outputTokens": 115, "cacheReadInputTokens": 4500,
            "cacheCreationInputTokens": 500, "webSearchRequests": 0, "costUSD": 0.03,
            "contextWindow": 200000, "maxOutputTokens": 64000},
    "claude-haiku-4-5-20251001": {
        "inputTokens": 1200, "outputTokens": 300, "cacheReadInputTokens": 0,
        "cacheCreationInputTokens": 800, "webSearchRequests": 0, "costUSD": 0.0042,
        "contextWindow": 200000, "maxOutputTokens": 64000},
}


def option(argv: list[str], name: str) -> str | None:
    """The value of ``--name value`` or ``--name=value``; the last one when given
    more than once, as the CLI (commander.js) takes it."""
    found = None
    for index, word in enumerate(argv):
        if word == name and index + 1 < len(argv):
            found = argv[index + 1]
        elif word.startswith(name + "="):
            found = word.split("=", 1)[1]
    return found




def record(path: str, argv: list[str], prompt: str) -> None:
    entry: dict[str, Any] = {
        "argv": argv,
        "prompt": prompt,
        "env": {
            "PROHOST_RUN_ID": os.environ.get("PROHOST_RUN_ID"),
            "PROHOST_PAIRED_RUN": os.environ.get("PROHOST_PAIRED_RUN"),
        },
        "claudecode_set": "CLAUDECODE" in os.environ,
        "config_dir": os.environ.get("CLAUDE_CONFIG_DIR"),
        # The account's login store (each conversation has a config folder of its own).
        "login_dir": os.environ.get("CLAUDE_SECURESTORAGE_CONFIG_DIR")
        or os.environ.get("CLAUDE_CONFIG_DIR"),
    }
    config = option(argv, "--mcp-config")
    if config is not None:
        entry["mcp_config_path"] = os.path.abspath(config)
        try:
            with open(config, encoding="utf-8") as handle:
                entry["mcp_config"] = json.load(handle)
            entry["mcp_config_mode"] = stat.S_IMODE(os.stat(config).st_mode)
        except (OSError, ValueError) as exc:
            entry["mcp_config_error"] = str(exc)
    entries: list[Any] = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            entries = json.load(handle)
    entries.append(entry)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(entries, handle)


class Session:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.id = option(argv, "--resume") or str(uuid.uuid4())
        self.started = time.monotonic()
        self.turns = 0

    def init(self) -> None:
        skip = "--dangerously-skip-permissions" in self.argv
        servers = []
        if option(self.argv, "--mcp-config") is not None:
            servers.append({"name": "prohost", "status": "connected"})
        emit({
            "type": "system",
            "subtype": "init",
            "cwd": os.getcwd(),
            "session_id": self.id,
            "tools": ["Task", "Bash", "Glob", "Grep", "Read", "Edit", "Write", "WebFetch",
                      "TodoWrite", "WebSearch"],
            "mcp_servers": servers,
            "model": MODEL,
            "permissionMode": "bypassPermissions" if skip else "default",
            "slash_commands": ["compact", "cost", "context"],
            "apiKeySource": "none",
            "claude_code_version": VERSION,
            "output_style": "default",
            "agents": ["general-purpose", "Explore", "Plan"],
            "skills": [],
            "plugins": [],
            "uuid": str(uuid.uuid4()),
        })
        used = account_file("used_percent")
        if used is not None:
            self.rate_limit(status="allowed_warning", utilization=float(used) / 100,
                            rate_limit_type="seven_day")

    def assistant(self, content: list[dict[str, Any]], **extra: Any) -> None:
        self.turns += 1
        emit({
            "type": "assistant",
            "message": {
                "model": extra.pop("model", MODEL),
                "id": f"msg_01{uuid.uuid4().hex[:22]}",
                "type": "message",
                "role": "assistant",
                "content": content,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 4,
                    "cache_creation_input_tokens": 1520,
                    "cache_read_input_tokens": 14201,
                    "cache_creation": {"ephemeral_5m_input_tokens": 1520,
                                       "ephemeral_1h_input_tokens": 0},
                    "output_tokens": 12,
                    "service_tier": "standard",
                },
                "context_management": None,
            },
            "parent_tool_use_id": None,
            "session_id": self.id,
            "uuid": str(uuid.uuid4()),
            **extra,
        })

    def tool_result(self, tool_use_id: str, output: str, *, is_error: bool = False) -> None:
        emit({
            "type": "user",
            "message": {
                "role": "user",
                "content": [{"tool_use_id": tool_use_id, "type": "tool_result",
                             "content": output, "is_error": is_error}],
            },
            "parent_tool_use_id": None,
            "session_id": self.id,
            "uuid": str(uuid.uuid4()),
            "tool_use_result": {"stdout": output, "stderr": "", "interrupted": False,
                                "isImage": False},
        })

    def rate_limit(self, *, status: str = "allowed_warning", utilization: float | None = 0.91,
                   resets_at: int | None = None, rate_limit_type: str = "five_hour") -> None:
        # The shape of github.com/devblazer/dodona/issues/32 and
        # github.com/anthropics/claude-code/issues/38673 (CLI 2.1.83).
        info: dict[str, Any] = {
            "status": status,
            "resetsAt": resets_at if resets_at is not None else int(time.time()) + 3600,
            "rateLimitType": rate_limit_type,
            "overageStatus": "rejected",
            "overageDisabledReason": "org_level_disabled",
            "isUsingOverage": False,
        }
        if utilization is not None:
            info["utilization"] = utilization
        emit({
            "type": "rate_limit_event",
            "rate_limit_info": info,
            "uuid": str(uuid.uuid4()),
            "session_id": self.id,
        })

    def result(self, text: str, *, is_error: bool = False, subtype: str = "success",
               **extra: Any) -> None:
        elapsed = round((time.monotonic() - self.started) * 1000)
        event = {
            "type": "result",
            "subtype": subtype,
            "is_error": is_error,
            "duration_ms": elapsed,
            "duration_api_ms": max(0, elapsed - 5),
            "num_turns": self.turns,
            "result": text,
            "session_id": self.id,
            "total_cost_usd": COST if not is_error else 0,
            "usage": {
                "input_tokens": 150,
                "cache_creation_input_tokens": 500,
                "cache_read_input_tokens": 1500,
                "output_tokens": 75,
                "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
                "service_tier": "standard",
                "cache_creation": {"ephemeral_1h_input_tokens": 0,
                                   "ephemeral_5m_input_tokens": 500},
            },
            "modelUsage": {
                MODEL: {
                    "inputTokens": 150,
                    "outputTokens": 75,
                    "cacheReadInputTokens": 1500,
                    "cacheCreationInputTokens": 500,
                    "webSearchRequests": 0,
                    "costUSD": 0.0342,
                    "contextWindow": 200000,
                    "maxOutputTokens": 64000,
                },
            },
            "permission_denials": [],
            "uuid": str(uuid.uuid4()),
            **extra,
        }
        if subtype.startswith("error_max"):
            del event["result"]  # a run the CLI stopped has no result text
        emit(event)


def account_file(name: str) -> str | None:
    """The stripped content of ``name`` in this account's folder, if there: its login
    store (``CLAUDE_SECURESTORAGE_CONFIG_DIR``, the account's own, where each
    conversation has a config folder of its own), else its config folder."""
    folder = os.environ.get("CLAUDE_SECURESTORAGE_CONFIG_DIR") or os.environ.get(
        "CLAUDE_CONFIG_DIR")
    if not folder:
        return None
    try:
        with open(os.path.join(folder, name), encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def resets_text(epoch: int) -> str:
    """How the CLI says when a limit resets: ``8pm``, ``8:30pm``, or ``Apr 23 at 4pm``
    on another day, with the zone in brackets (github.com/anthropics/claude-code
    issues 22946, 77082 and 51981). The fake always speaks UTC."""
    moment = time.gmtime(epoch)
    hour = moment.tm_hour % 12 or 12
    clock = f"{hour}:{moment.tm_min:02d}" if moment.tm_min else f"{hour}"
    clock += "am" if moment.tm_hour < 12 else "pm"
    if time.strftime("%Y-%m-%d", moment) != time.strftime("%Y-%m-%d", time.gmtime()):
        clock = f"{time.strftime('%b', moment)} {moment.tm_mday} at {clock}"
    return f"{clock} (UTC)"


def limit_reached(session: Session, spec: str) -> int:
    """This account is at its usage limit: say so the way the CLI does, exit 1."""
    words = spec.split()
    epoch = int(words[0])
    if words[1:] == ["legacy"]:
        # Claude Code 1.0.x (github.com/anthropics/claude-code/issues/9046).
        text = f"Claude AI usage limit reached|{epoch}"
    else:
        text = f"You've hit your limit · resets {resets_text(epoch)}"
    session.init()
    cost: dict[str, Any] = {}
    if "spent" in words[1:]:
        session.assistant([{"type": "text", "text": "Working on it, one step at a time."}])
        cost["total_cost_usd"] = COST
    # The synthetic message the CLI makes up for a refused request: model
    # "<synthetic>", error "rate_limit" (github.com/anthropics/claude-code/issues/40485).
    session.assistant([{"type": "text", "text": text}], model="<synthetic>", error="rate_limit")
    session.rate_limit(status="rejected", utilization=None, resets_at=epoch)
    session.result(text, is_error=True, **cost)
    return 1


def tool_run(session: Session, reply: str, noise: bool = False) -> None:
    def junk(text: str) -> None:
        if noise:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    junk("Warning: this is not JSON")
    session.init()
    junk("")
    junk("{not json either")
    tool_id = "toolu_01" + uuid.uuid4().hex[:22]
    session.assistant([
        {"type": "text", "text": "I'll run the tests."},
        {"type": "tool_use", "id": tool_id, "name": "Bash",
         "input": {"command": "pytest -q", "description": "Run the test suite"}},
    ])
    junk("[1, 2, 3]")
    session.tool_result(tool_id, "12 passed in 0.31s")
    junk("\x1b[33mprogress 50%\x1b[0m")
    session.assistant([{"type": "text", "text": reply}])
    session.result(reply)
    junk("trailing noise")


def wait_for_the_gate(port: int) -> None:
    """Hold this invocation until the test says go (FAKE_CLAUDE_GATE)."""
    with announce(port) as conn:
        if not conn.makefile("r", encoding="utf-8").readline():
            sys.exit(3)


def run_tool(command: str) -> str:
    """What the agent's shell tool prints for ``command`` (``FAKE_AGENT_TOOL``): run
    as the real CLI runs its Bash tool, as a child of the CLI's process."""
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip()


def main() -> int:
    argv = sys.argv[1:]
    if "--version" in argv:
        print(f"{VERSION} (Claude Code)")
        return 0
    scenario = option(argv, "--fake-scenario") or os.environ.get("FAKE_CLAUDE_SCENARIO", "reply")
    prompt = sys.stdin.read()
    if path := os.environ.get("FAKE_CLAUDE_RECORD"):
        record(path, argv, prompt)
    refuse = os.environ.get("FAKE_CLAUDE_REFUSE")
    if refuse and os.path.exists(refuse):
        with open(refuse, encoding="utf-8") as handle:
            flag = handle.read().strip()
        sys.stderr.write(f"error: unknown option '{flag}'\n")
        return 1
    if gate := os.environ.get("FAKE_CLAUDE_GATE"):
        wait_for_the_gate(int(gate))
    reply = os.environ.get("FAKE_CLAUDE_REPLY", "Hello from the fake Claude.")
    if tool := os.environ.get("FAKE_AGENT_TOOL"):
        reply = run_tool(tool)
    session = Session(argv)
    limit = account_file("limit")
    if limit is not None:
        return limit_reached(session, limit)

    if scenario == "no_session" and option(argv, "--resume") is not None:
        message = f"No conversation found with session ID: {session.id}"
        emit({
            "type": "result",
            "subtype": "error_during_execution",
            "duration_ms": 0,
            "duration_api_ms": 0,
            "is_error": True,
            "num_turns": 0,
            "session_id": session.id,
            "total_cost_usd": json.loads(os.environ.get("FAKE_CLAUDE_REFUSED_COST", "0")),
            "usage": {"input_tokens": 0, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": 0,
                      "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
                      "service_tier": "standard"},
            "modelUsage": {},
            "permission_denials": [],
            "uuid": str(uuid.uuid4()),
            "errors": [message],
        })
        sys.stderr.write(message + "\n")
        return 1
    if scenario == "lone_surrogate":
        reply += " " + LONE_SURROGATE
    elif scenario == "bad_byte":
        reply += " " + BAD_BYTE
    budget = option(argv, "--max-budget-usd")
    if budget is not None and float(budget) < COST:
        session.init()
        session.assistant([{"type": "text", "text": "Working on it, one step at a time."}])
        session.result("", is_error=True, subtype="error_max_budget_usd", errors=[],
                       total_cost_usd=COST)
        return 1
    if scenario in ("reply", "no_session", "lone_surrogate", "bad_byte"):
        session.init()
        session.assistant([{"type": "text", "text": reply}])
        session.result(reply)
    elif scenario == "subagent":
        session.init()
        session.assistant([{"type": "text", "text": reply}])
        session.result(reply, modelUsage=SUBAGENT_MODEL_USAGE)
    elif scenario == "tool":
        tool_run(session, reply)
    elif scenario == "noise":
        tool_run(session, reply, noise=True)
    elif scenario == "is_error":
        text = "Invalid API key · Please run /login"
        session.init()
        session.assistant([{"type": "text", "text": text}], model="<synthetic>",
                          error="authentication_failed")
        session.result(text, is_error=True)
        return 1
    elif scenario == "rate_limit":
        session.init()
        session.rate_limit()
        session.assistant([{"type": "text", "text": reply}])
        session.result(reply)
    elif scenario == "huge_line":
        session.init()
        session.assistant([{"type": "text", "text": "x" * HUGE_BYTES}])
        session.result(reply)
    elif scenario == "errors_forever":
        count = 0
        while True:
            count += 1
            sys.stderr.write(f"API Error: 529 Overloaded (attempt {count})\n")
            sys.stderr.flush()
            time.sleep(0.01)
    else:
        sys.stderr.write(f"fake_claude: unknown scenario {scenario!r}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
