"""The ``prohost`` command line.

Parsing is strict and happens before anything else: a bad flag exits 2 with one
line on stderr, before a socket is opened or a file is touched. The commands'
implementations are imported only when they run (:mod:`prohost.cli_handlers`), so
``--help`` and flag errors stay fast and never depend on the heavier modules.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from prohost import __version__, cli_handlers
from prohost.cli_handlers import PAIR_VALUES, SERVER_VALUES
from prohost.options import (
    DEFAULT_EXEC,
    MAX_CONCURRENCY,
    VALUE_DESCRIPTIONS,
    default_machine_name,
)

DEFAULT_SERVER_HOST = "127.0.0.1"
DEFAULT_SERVER_PORT = 8765
DEFAULT_SEND_SERVER = f"http://{DEFAULT_SERVER_HOST}:{DEFAULT_SERVER_PORT}"

_EXPECTED_ONE = re.compile(r"argument (?P<flags>[^:]+): expected one argument")
_INVALID_CHOICE = re.compile(r"argument (?P<arg>[^:]+): invalid choice: '(?P<given>[^']*)' "
                             r"\(choose from (?P<choices>.*)\)")
_UNRECOGNIZED = "unrecognized arguments: "


def closest(given: str, known: Sequence[str]) -> str | None:
    """The one of ``known`` that ``given`` most likely misspells or shortens, if any.
    (argparse's own ``suggest_on_error`` arrived in Python 3.14; this runs on 3.11.)"""
    starting = [name for name in known if name.startswith(given) and len(given) >= 3]
    if len(starting) == 1:
        return starting[0]
    matches = difflib.get_close_matches(given, known, n=1, cutoff=0.6)
    return matches[0] if matches else None

Handler = Callable[[argparse.Namespace], int]


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line that says what the flag accepts.

    argparse's own "expected one argument" names the flag but not what to give
    it; ``value_descriptions`` (flag → what it accepts) fills that in, so a
    forgotten value reads like every other flag error.
    """

    def __init__(
        self,
        *args: object,
        value_descriptions: Mapping[str, str] | None = None,
        **kwargs: object,
    ) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--conc 4` must not silently mean --concurrency
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.value_descriptions = dict(value_descriptions or {})

    def explain(self, message: str) -> str:
        match = _EXPECTED_ONE.fullmatch(message)
        if match:
            for flag in match["flags"].split("/"):
                if flag in self.value_descriptions:
                    return f"{flag} needs a value: {self.value_descriptions[flag]}"
        choice = _INVALID_CHOICE.fullmatch(message)
        if choice:
            guess = closest(choice["given"], re.findall(r"'([^']*)'", choice["choices"]))
            if guess is not None:
                return f"{message}; did you mean {guess!r}?"
        if message.startswith(_UNRECOGNIZED):
            return _UNRECOGNIZED + " ".join(
                self._with_guess(word) for word in message[len(_UNRECOGNIZED):].split(" "))
        return message

    def _with_guess(self, word: str) -> str:
        """An unknown word of the command line, with the flag it probably meant."""
        if not word.startswith("--"):
            return word
        flags = [flag for flag in self._option_string_actions if flag.startswith("--")]
        guess = closest(word.split("=", 1)[0], flags)
        return word if guess is None else f"{word} (did you mean {guess}?)"

    def error(self, message: str) -> NoReturn:
        line = " ".join(self.explain(message).splitlines())
        self.exit(2, f"{self.prog}: error: {line}\n")


# --- the parser tree ---------------------------------------------------------------

_SEND_VALUES = {
    "--server": "the reference server's http:// URL, e.g. " + DEFAULT_SEND_SERVER,
    "--conversation": "a conversation id, e.g. C42",
}


def _add_verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log debug details too (default: info)"
    )


_GC_VALUES = {"--older-than": "a number of days of 0 or more, e.g. 14 or 0.5"}
_LOGS_VALUES = {"--lines": "a number of lines, 0 or more, e.g. 100"}
_RUNS_VALUES = {"--limit": "a number of runs, 1 or more, e.g. 50",
                "--show": "a run id, or its first characters"}


def _add_run_flags(parser: ArgumentParser, host: str) -> None:
    """The flags of ``agent run``, shared with ``agent install-daemon`` so a service
    is installed with exactly what ``agent run`` would accept."""
    parser.add_argument(
        "--exec", dest="exec_command", metavar="CMD",
        help="shell command line that runs the agent; the prompt arrives on its stdin "
        f"(default: {DEFAULT_EXEC!r})",
    )
    parser.add_argument(
        "--url", metavar="URL",
        help="the server's agent WebSocket, ws:// or wss://; results are posted to the "
        "http(s) address of the same host (default: $PROHOST_WS_URL, else the URL saved by "
        "`prohost agent pair`, else wss://api.prohost.ai/v1/agent/ws)",
    )
    parser.add_argument(
        "--machine", metavar="NAME",
        help=f"the name this machine is shown under (default: the host name, {host!r})",
    )
    parser.add_argument(
        "--workdir", metavar="DIR",
        help="directory the agent runs in; a relative path is taken from the current "
        "directory (default: $PROHOST_HOME/workspace)",
    )
    parser.add_argument(
        "--timeout", metavar="DURATION",
        help="limit on each whole run, retries included; 0 means no limit (default: 0)",
    )
    parser.add_argument(
        "--idle-timeout", metavar="DURATION",
        help="stop a run whose agent prints nothing on stdout or stderr for this long; "
        "0 means never (default: 15m, i.e. 900 seconds)",
    )
    parser.add_argument(
        "--concurrency", metavar="N",
        help=f"how many runs may execute at once, 1 to {MAX_CONCURRENCY}; turns of one "
        "conversation still run one after another (default: 1)",
    )
    parser.add_argument(
        "--brain", metavar="NAME",
        help="how to drive the agent CLI: claude (stream-json, sessions resumed per "
        "conversation, tool calls on the timeline), codex (codex exec --json, threads "
        "resumed), acp (an agent spoken to over the Agent Client Protocol: gemini --acp, "
        "opencode acp, …), plain (any command; its stdout is the reply), or auto: chosen "
        "from the program --exec runs (default: auto)",
    )
    parser.add_argument(
        "--safe-tools", "--no-skip-permissions", dest="safe_tools", action="store_true",
        help="keep the agent CLI's permission prompts: do not add the flag that lets "
        "claude or codex use every tool unattended (a run then stops where a tool "
        "needs approval)",
    )
    parser.add_argument(
        "--acp-model", metavar="[ACCOUNT=]MODEL", action="append",
        help="for an ACP agent: the model each session is given once open, as the agent "
        "names it (e.g. gemini-2.5-pro); ACCOUNT= for one --account only (default: the "
        "agent's own)",
    )
    parser.add_argument(
        "--acp-mode", metavar="[ACCOUNT=]MODE", action="append",
        help="for an ACP agent: the mode each session is given once open (e.g. default, "
        "read-only, auto); ACCOUNT= for one --account only (default: the agent's own; "
        "with --safe-tools its asking mode where it has one)",
    )
    parser.add_argument(
        "--repos", metavar="PATHS", action="append",
        help="git checkouts the agent works on, separated by commas or given by repeating "
        "the flag (--repos a,b is --repos a --repos b; each checkout once); each "
        "conversation gets a private worktree of each under $PROHOST_HOME/worktrees, kept "
        "between its turns, so runs in parallel never share a checkout (default: none)",
    )
    parser.add_argument(
        "--account", dest="accounts", metavar="NAME=DIR", action="append",
        help="an agent CLI login to use, by name and its config folder (CLAUDE_CONFIG_DIR "
        "for claude, CODEX_HOME for codex), e.g. --account work=~/.claude-work; repeat it "
        "for each login. Each run uses one; a conversation keeps its account while it is "
        "usable, and a run that hits an account's usage limit moves to another "
        "(default: the CLI's own folder, as without prohost)",
    )
    parser.add_argument(
        "--limit-wait", metavar="DURATION",
        help="while every account is at its usage limit, how long a queued run waits for "
        "the earliest reset before it is reported retryable (default: 15m)",
    )
    parser.add_argument(
        "--max-cost", metavar="USD",
        help="what one run may spend, in US dollars (e.g. 2.50): Claude Code stops the "
        "run there and it is reported failed, with its session so the conversation can "
        "go on (docs/protocol.md §12); refused for a brain that cannot bound its cost "
        "(default: no budget)",
    )
    parser.add_argument(
        "--max-queued", metavar="N",
        help="how many runs may wait for a slot; past that, new runs are refused with 503 "
        "\"queue full\" and the server offers them again later, or to another machine "
        "(1 to 10000; default: 10000)",
    )
    parser.add_argument(
        "--sandbox", metavar="MODE",
        help="confine each agent and everything it starts (Landlock on Linux, sandbox-exec "
        "on macOS) so that it can write only its run's places (its working directory or "
        "its conversation's worktrees, a private TMPDIR, its CLI's config folder, the "
        "usual caches) and cannot read $PROHOST_HOME or the usual secrets (~/.ssh, "
        "~/.aws, ...): auto confines where the system can and otherwise says so once at "
        "start; required refuses to start (exit 2) where it cannot; off runs agents "
        "unconfined (default: auto; see docs/security.md)",
    )
    parser.add_argument(
        "--allow-write", dest="allow_write", metavar="PATH", action="append",
        help="also let confined agents write (and read) this existing file or folder, "
        "e.g. a log folder or ~/.m2; repeat it for each (default: none)",
    )
    parser.add_argument(
        "--allow-read", dest="allow_read", metavar="PATH", action="append",
        help="also let confined agents read this existing file or folder, even one hidden "
        "by default, e.g. --allow-read ~/.ssh to push over SSH; repeat it for each "
        "(default: none)",
    )
    parser.add_argument(
        "--no-panel", action="store_true",
        help="log one plain line per change instead of drawing the live status panel "
        "(the default when stdout is not a terminal, e.g. under a service manager)",
    )
    parser.add_argument(
        "--dry-run", action="store_true",
        help="accept and acknowledge runs but run nothing, report nothing and keep no "
        "ledger; only the log shows what arrived (for checking the connection)",
    )
    parser.add_argument(
        "--allow-unverified", action="store_true",
        help="accept deliveries whose signature is missing, wrong or stale, with a warning "
        "logged for each (only for development servers)",
    )


def _add_server_state(parser: ArgumentParser) -> None:
    """``--state DIR``: where the server's API token is, for what changes its runs."""
    parser.add_argument(
        "--state", metavar="DIR",
        help="the server's state folder, where it keeps the API token this needs (the "
        "banner of `prohost server` names it) (default: $PROHOST_HOME/server, where "
        "`prohost server` keeps it)",
    )


def _add_runs(commands: argparse._SubParsersAction[ArgumentParser]) -> None:
    """``prohost runs show|cancel ID``: a run on the reference server, by id."""
    runs = commands.add_parser(
        "runs", prog="prohost runs", help="look up or cancel a run on the reference server",
        description="Look up or cancel a run on the reference server by its id (the one "
        "`prohost send` printed).",
    )
    runs.set_defaults(handler=None, parser=runs)
    verbs = runs.add_subparsers(title="commands", metavar="COMMAND", parser_class=ArgumentParser)
    for verb, summary in (
        ("show", "print a run: its state, machine, reply or error, and any retry of it"),
        ("cancel", "cancel a run: a queued one never starts, a running one is stopped"),
    ):
        parser = verbs.add_parser(
            verb, prog=f"prohost runs {verb}", value_descriptions=_SEND_VALUES, help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog="Exit status: 0 done; 1 the server could not be reached, has no such "
            "run" + (", or the run has ended already" if verb == "cancel" else "")
            + "; 2 more than one run starts with ID (they are listed).",
        )
        parser.add_argument("run_id", metavar="ID",
                            help="the run's id, e.g. run_0123abcd, or its first characters, "
                            "with or without run_ (0123)")
        parser.add_argument(
            "--server", metavar="URL", default=DEFAULT_SEND_SERVER,
            help=f"the reference server's http:// URL (default: {DEFAULT_SEND_SERVER})",
        )
        if verb == "show":
            parser.add_argument("--json", action="store_true",
                                help="print the server's JSON for the run, for scripts")
        else:
            parser.add_argument("--reason", metavar="TEXT",
                                help="why, passed to the run's report (default: "
                                "\"cancelled by the user\")")
            _add_server_state(parser)
        _add_verbose(parser)
        parser.set_defaults(handler=cli_handlers.runs_verb, parser=parser, verb=verb)


def build_parser() -> ArgumentParser:
    """The whole ``prohost`` argument tree (no side effects; safe to call in tests)."""
    host = default_machine_name()
    top = ArgumentParser(
        prog="prohost",
        description="Run a chat service's agent requests on this machine with a local "
        "coding-agent CLI.",
    )
    top.add_argument("--version", action="version", version=f"prohost {__version__}")
    top.set_defaults(handler=None, parser=top)
    commands = top.add_subparsers(title="commands", metavar="COMMAND", parser_class=ArgumentParser)

    agent = commands.add_parser(
        "agent", prog="prohost agent", help="run or pair this machine's agent harness",
        description="Run or pair this machine's agent harness.",
    )
    agent.set_defaults(handler=None, parser=agent)
    agent_commands = agent.add_subparsers(
        title="commands", metavar="COMMAND", parser_class=ArgumentParser
    )

    run = agent_commands.add_parser(
        "run",
        prog="prohost agent run",
        value_descriptions=VALUE_DESCRIPTIONS,
        help="connect to the server and run the agent requests it sends",
        description="Connect to the server's agent socket, accept agent runs, run the local "
        "agent CLI on each, and post the replies back. Stop with Ctrl-C: the first one "
        "finishes the runs in progress, the second stops them (from another shell: "
        "`prohost agent stop`, and `--now`).",
        epilog="Durations are seconds, or a number with s, m or h: 600, 90s, 1.5m, 15m, 2h. "
        "$PROHOST_HOME (default ~/.prohost) holds the credentials, the run ledger and the "
        "lock that keeps one agent per home.",
    )
    _add_run_flags(run, host)
    _add_verbose(run)
    run.set_defaults(handler=cli_handlers.agent_run, parser=run)

    pair = agent_commands.add_parser(
        "pair",
        prog="prohost agent pair",
        value_descriptions=PAIR_VALUES,
        help="pair this machine with your account using a one-time code",
        description="Trade a one-time pairing code for this machine's credentials, saved "
        "in $PROHOST_HOME/credentials.json (mode 0600).",
        epilog="Exit status: 0 paired; 1 the pairing failed (nothing was saved); 2 a bad "
        "flag, or a harness is running on this $PROHOST_HOME (its credentials are not "
        "replaced and the code is not spent: stop it first).",
    )
    pair.add_argument(
        "--code", metavar="CODE", required=True,
        help="the one-time pairing code your server shows (the service's web app; the "
        "banner of `prohost server`), e.g. ABCD-1234 (required)",
    )
    pair.add_argument(
        "--url", metavar="URL",
        help="the server's agent WebSocket, ws:// or wss://; pairing goes to the http(s) "
        "address of the same host (default: $PROHOST_WS_URL, else "
        "wss://api.prohost.ai/v1/agent/ws)",
    )
    pair.add_argument(
        "--machine", metavar="NAME",
        help=f"the name this machine is shown under (default: the host name, {host!r})",
    )
    _add_verbose(pair)
    pair.set_defaults(handler=cli_handlers.agent_pair, parser=pair)

    status = agent_commands.add_parser(
        "status",
        prog="prohost agent status",
        help="show what the agent harness on this machine is doing",
        description="Print what the running `prohost agent run` on this $PROHOST_HOME is "
        "doing: its connection, the runs in progress and the last finished ones, as its "
        "panel shows them.",
        epilog="Exit status: 0 an agent is running; 1 none is running (or its status file "
        "is unreadable); 3 its process exists but its status has not been updated for 30 s "
        "or more (it may be hung); 4 an agent is running but has never connected to its "
        "server (a wrong --url, a server that is down: its log says why). "
        'With --json, the snapshot is printed with "running" and "age_s" added; when no '
        'agent is running it is {"running": false, ...}.',
    )
    status.add_argument("--json", action="store_true", help="print the status as JSON, for scripts")
    status.set_defaults(handler=cli_handlers.agent_status, parser=status)

    stop = agent_commands.add_parser(
        "stop",
        prog="prohost agent stop",
        help="drain the agent harness running on this machine and wait until it has exited",
        description="Signal the `prohost agent run` on this $PROHOST_HOME to drain, as a "
        "first Ctrl-C does: it finishes the runs in progress, takes no new ones and exits. "
        "Waits until its process has exited.",
        epilog="What happens to the runs: a drain finishes the running ones; the queued "
        "ones, and with --now the running ones too, are reported failed and retryable, "
        "so the server runs them again, on this machine once the harness is started "
        "again. To end one run for good instead, `prohost agent cancel RUN`. "
        "Exit status: 0 it has exited; 1 no agent is running on this home; 130 "
        "interrupted while waiting (the harness carries on).",
    )
    stop.add_argument(
        "--now", action="store_true",
        help="stop the running agents too, as a second Ctrl-C does (the harness exits "
        "within 5 s; a stopped run is reported failed and retryable: the server runs it "
        "again after the restart)",
    )
    stop.set_defaults(handler=cli_handlers.agent_stop, parser=stop)

    cancel = agent_commands.add_parser(
        "cancel",
        prog="prohost agent cancel",
        help="cancel one run of the agent harness running on this machine, for good",
        description="Ask the `prohost agent run` on this $PROHOST_HOME to cancel one run, as "
        "a cancel from the server does: a queued run never starts, a running one has its "
        "agent stopped, and it is reported cancelled (with what it changed and spent), "
        "not retryable, so the server never runs it again. The harness goes on with its "
        "other runs. Waits until the run has ended.",
        epilog="Exit status: 0 cancelled (or it ended before the cancel reached it, which "
        "it says); 1 no agent is running on this home, no run has that id, or the run "
        "has already ended (it says how); 2 more than one run starts with RUN (they are "
        "listed); 130 interrupted while waiting (the run is cancelled all the same).",
    )
    cancel.add_argument(
        "run", metavar="RUN",
        help="the run's id, or its first characters, with or without run_ (as `prohost "
        "agent runs` lists them)",
    )
    cancel.set_defaults(handler=cli_handlers.agent_cancel, parser=cancel)

    logs = agent_commands.add_parser(
        "logs",
        prog="prohost agent logs",
        value_descriptions=_LOGS_VALUES,
        help="print the agent harness's log file ($PROHOST_HOME/logs/agent.log)",
        description="Print the log that `prohost agent run` (in a terminal or as a service) "
        "writes to $PROHOST_HOME/logs/agent.log, rotated by size.",
        epilog="Exit status: 0 printed; 1 there is no log yet.",
    )
    logs.add_argument(
        "-f", "--follow", action="store_true",
        help="then keep printing the lines as they are written, across rotations, "
        "until Ctrl-C",
    )
    logs.add_argument(
        "-n", "--lines", metavar="N",
        help="print only the last N lines of the file (default: all of it)",
    )
    logs.set_defaults(handler=cli_handlers.agent_logs, parser=logs)

    runs = agent_commands.add_parser(
        "runs",
        prog="prohost agent runs",
        value_descriptions=_RUNS_VALUES,
        help="list the runs this machine has accepted, newest first (from its ledger)",
        description="List the runs in this $PROHOST_HOME's run ledger, newest first: when "
        "each was accepted, its id, conversation, state, duration, cost, and the branch "
        "and commit it left each checkout on. Read-only: safe beside a running harness.",
        epilog="Runs are kept 30 days (their bodies and outcomes 7). With --json, one JSON "
        "array of objects with run_id, conversation_id, state, ok, error, accepted_at, "
        "started_at, finished_at, duration_ms, account, cost_usd and checkouts (repo, "
        "branch, head each). Exit status: 0 listed; 1 the ledger cannot be read, or "
        "--show names no run in it; 2 more than one run starts with the id given to "
        "--show (they are listed).",
    )
    runs.add_argument("--json", action="store_true", help="print JSON, for scripts")
    runs.add_argument(
        "--limit", metavar="N", help="list at most the N newest runs (default: 20)",
    )
    runs.add_argument(
        "--show", metavar="ID",
        help="print one run in full, with the last 64 KiB of its agent's stderr; ID may "
        "be its first characters, with or without run_ (e.g. 673c), as long as no other "
        "run's id starts with them",
    )
    runs.set_defaults(handler=cli_handlers.agent_runs, parser=runs)

    gc_parser = agent_commands.add_parser(
        "gc",
        prog="prohost agent gc",
        value_descriptions=_GC_VALUES,
        help="remove the private worktrees of conversations that have gone quiet",
        description="Remove the git worktrees (agent run --repos) of conversations idle for "
        "longer than --older-than days. One with uncommitted changes or commits on no branch "
        "is kept and listed, unless --force. A running harness does the same once a day. "
        "Beside a running harness, the conversations it is running (from its "
        "$PROHOST_HOME/status.json) are kept; if that file is missing or not current, "
        "nothing is removed.",
    )
    gc_parser.add_argument(
        "--older-than", metavar="DAYS",
        help="remove those of conversations idle this many days (default: 14)",
    )
    gc_parser.add_argument(
        "--dry-run", action="store_true", help="say what would be removed, remove nothing"
    )
    gc_parser.add_argument(
        "--force", action="store_true",
        help="also remove worktrees with uncommitted changes or commits on no branch "
        "(that work is lost)",
    )
    _add_verbose(gc_parser)
    gc_parser.set_defaults(handler=cli_handlers.agent_gc, parser=gc_parser)

    install = agent_commands.add_parser(
        "install-daemon",
        prog="prohost agent install-daemon",
        value_descriptions=VALUE_DESCRIPTIONS,
        help="run `agent run` with these flags as a login service (systemd --user / launchd)",
        description="Install a systemd user unit (Linux) or a launchd LaunchAgent (macOS) "
        "that runs `prohost agent run` with exactly these flags, restarts it on failure, "
        "and gives it time to drain when stopped. Flags are checked now: a bad one fails "
        "the install, never the service.",
        epilog="Logs go to $PROHOST_HOME/logs/agent.log, rotated by size.",
    )
    _add_run_flags(install, host)
    install.add_argument(
        "--pass-env", dest="pass_env", metavar="NAME", action="append", default=[],
        help="also give the service this variable of your shell (repeatable); the agent "
        "CLIs' documented login and endpoint variables are passed without it",
    )
    install.add_argument(
        "--print", dest="print_only", action="store_true",
        help="print the unit or plist instead of installing it, secret values masked "
        "(touches nothing)",
    )
    _add_verbose(install)
    install.set_defaults(handler=cli_handlers.agent_install_daemon, parser=install)

    uninstall = agent_commands.add_parser(
        "uninstall-daemon",
        prog="prohost agent uninstall-daemon",
        help="stop this $PROHOST_HOME's service (after a drain) and remove it",
        description="Stop the service `agent install-daemon` installed for this "
        "$PROHOST_HOME (it drains first) and remove its unit or plist.",
    )
    _add_verbose(uninstall)
    uninstall.set_defaults(handler=cli_handlers.agent_uninstall_daemon, parser=uninstall)

    server = commands.add_parser(
        "server",
        prog="prohost server",
        value_descriptions=SERVER_VALUES,
        help="run the reference server (for development, tests and demos)",
        description="Run the reference server: it signs and delivers runs to connected "
        "harnesses and collects their results.",
        epilog="Fault hooks (only with --faults; JSON bodies): POST /v1/faults/drop aborts "
        "every harness socket; POST /v1/faults/storm {\"status\": 503, \"count\": 5, "
        "\"retry_after\": 2} answers the next COUNT completion POSTs with STATUS (408, 429, "
        "500, 502, 503 or 504); POST /v1/faults/restart {\"down_s\": 2} closes every socket, "
        "stops listening for DOWN_S seconds, then listens on the same port again, keeping all "
        "state; POST /v1/faults/forget {\"count\": 1} or {\"run_id\": ID} answers a valid "
        "completion 200 and drops it; POST /v1/faults/redeliver {\"run_id\": ID} sends a "
        "run's delivery again whatever its state (409 with no harness connected); "
        "GET /v1/faults/runs lists per run its state, acks and "
        "every completion POST with its status and body; GET /v1/faults shows the counters.",
    )
    server.add_argument(
        "--host", metavar="HOST", default=DEFAULT_SERVER_HOST,
        help=f"address to listen on (default: {DEFAULT_SERVER_HOST}, this machine only)",
    )
    server.add_argument(
        "--port", metavar="PORT", default=str(DEFAULT_SERVER_PORT),
        help=f"TCP port to listen on, 0 for any free one (default: {DEFAULT_SERVER_PORT})",
    )
    server.add_argument(
        "--state", metavar="DIR",
        help="folder where the pairings are kept, so harnesses stay paired when the server "
        "restarts (pairings.json, mode 0600); a relative path is taken from the current "
        "directory (default: $PROHOST_HOME/server, i.e. ~/.prohost/server)",
    )
    server.add_argument(
        "--no-state", action="store_true",
        help="keep the pairings in memory only: every harness pairs again after a restart "
        "(for throwaway servers in tests)",
    )
    server.add_argument(
        "--retries", metavar="N", default="5",
        help="how many times a run that failed retryable (handed back \"not started\" by a "
        "draining harness, \"restarted\", \"internal error\") is submitted again as a new "
        "run, to the next harness that connects, after 1 s, 2 s, 4 s… (at most 30 s); "
        "`prohost runs show ID` follows it; 0: never (default: 5)",
    )
    server.add_argument(
        "--faults", action="store_true",
        help="serve the fault hooks under /v1/faults (for soak tests; see below). Without "
        "this flag those routes do not exist (404)",
    )
    _add_verbose(server)
    server.set_defaults(handler=cli_handlers.server, parser=server)

    send = commands.add_parser(
        "send",
        prog="prohost send",
        value_descriptions=_SEND_VALUES,
        help="send a message to the reference server as a new agent run",
        description="Send TEXT to a reference server, which delivers it to a connected "
        "harness as an agent run.",
        epilog="Exit status: 0 sent (with --wait: the run completed); 1 the run failed or "
        "was cancelled, or the server could not be reached; 3 --fail-without-harness and "
        "no harness is connected; 130 Ctrl-C while waiting (the run goes on at the server: "
        "`prohost runs show ID`).",
    )
    send.add_argument(
        "--server", metavar="URL", default=DEFAULT_SEND_SERVER,
        help=f"the reference server's http:// URL (default: {DEFAULT_SEND_SERVER})",
    )
    send.add_argument(
        "--conversation", metavar="C",
        help="conversation id; turns of one conversation run in order and resume the "
        "agent's session (default: a new conversation)",
    )
    send.add_argument(
        "--wait", action="store_true",
        help="wait for the run to finish and print its reply (default: print the run id "
        "and return at once)",
    )
    send.add_argument(
        "--fail-without-harness", action="store_true",
        help="with --wait: give up (exit 3) when no harness is connected to take the run "
        "and none is expected back (one connected until moments ago, as after a restart "
        "of the server, is waited for), instead of saying so and waiting for one; the run "
        "stays queued on the server (default: wait)",
    )
    _add_server_state(send)
    send.add_argument("text", metavar="TEXT", help="the message for the agent")
    _add_verbose(send)
    send.set_defaults(handler=cli_handlers.send, parser=send)

    _add_runs(commands)

    demo = commands.add_parser(
        "demo",
        prog="prohost demo",
        help="run a local end-to-end demo (reference server, harness and a fake agent)",
        description="Run a self-contained demo on this machine.",
    )
    demo.add_argument(
        "--keep", action="store_true",
        help="leave the demo's repository (each conversation's work on its own branch) "
        "and home behind, and print where they are (default: remove them)",
    )
    _add_verbose(demo)
    demo.set_defaults(handler=cli_handlers.demo, parser=demo)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``prohost`` command; return its exit code (2: bad flags, 130: interrupted)."""
    try:
        parser = build_parser()
        ns, extras = parser.parse_known_args(argv)
        if extras:
            # Reported by the subcommand that was given them, not by `prohost`.
            ns.parser.error(f"unrecognized arguments: {' '.join(extras)}")
        handler: Handler | None = ns.handler
        if handler is None:
            # `prohost` or `prohost agent` alone: show what can follow.
            ns.parser.print_help(sys.stderr)
            return 2
        return handler(ns)
    except SystemExit as exc:
        # argparse (and --version/--help) exit this way; callers get a plain int.
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Ctrl-C outside trio (start-up, imports): the user knows; no traceback.
        print(file=sys.stderr)
        return 130
