"""What each subcommand does with its parsed flags: check what argparse cannot,
set up logging, and call its front-end in :mod:`prohost.commands` (or the server).

:mod:`prohost.cli` builds the one argparse tree and names these as the handlers.
Everything heavier than the standard library is imported inside a handler, only
when its command runs, so ``--help`` and flag errors stay fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from prohost.logfile import setup_logging
from prohost.options import (
    MAX_COUNT_DIGITS,
    VALUE_DESCRIPTIONS,
    OptionError,
    Options,
    check_machine,
    check_url,
    default_machine_name,
    whole_number,
)

#: What the values of ``agent pair`` and ``server`` must be, for their errors.
PAIR_VALUES = {
    "--code": "the pairing code your server shows, e.g. ABCD-1234",
    "--url": VALUE_DESCRIPTIONS["--url"],
    "--machine": VALUE_DESCRIPTIONS["--machine"],
}
SERVER_VALUES = {
    "--host": "an address to listen on, e.g. 127.0.0.1 or 0.0.0.0",
    "--port": "a port number from 0 to 65535 (0 picks a free one)",
    "--state": "a folder for the server's pairings, e.g. ~/.prohost/server",
    "--retries": "a whole number from 0 to 100, e.g. 5",
}


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1


def _check_budget(parser: argparse.ArgumentParser, options: Options) -> None:
    """--max-cost only with a brain that can bound a run's cost (§12): else exit 2."""
    if options.max_cost_usd is None and not options.acp_model and not options.acp_mode:
        return
    from prohost.engine.agent.brains import BudgetRefused, brain_for

    try:
        brain_for(options.brain, options.exec_command, max_cost_usd=options.max_cost_usd,
                  acp_model=options.acp_model, acp_mode=options.acp_mode)
    except BudgetRefused as exc:
        parser.error(str(exc))


def _check_sandbox(parser: argparse.ArgumentParser, options: Options) -> None:
    """--sandbox required where the system cannot confine agents (§13): exit 2 with
    the reason and what to do. Asked of the system as the harness will ask it."""
    if options.sandbox != "required":
        return
    from prohost.engine.sandbox import probe

    support = probe()
    if support.kind is None:
        parser.error(f"--sandbox required: this system cannot confine agents: "
                     f"{support.reason}. Run on a system that can (Linux with unprivileged "
                     "user namespaces for bubblewrap and Landlock ABI 6, or macOS), or use "
                     "--sandbox auto to run them unconfined, said at start and in each "
                     "completion")
    if support.gaps:
        why = f" ({support.reason})" if support.reason else ""
        parser.error(f"--sandbox required: this system confines agents only in part with "
                     f"{support.detail}{why}; not covered: {'; '.join(support.gaps)}. "
                     "Allow unprivileged user namespaces (or give bwrap an AppArmor "
                     "profile) and use Linux 6.12 or later, or use --sandbox auto to run "
                     "them as confined as this system allows, said at start and in each "
                     "completion")
    from prohost.engine.run.confine import granted_sockets

    granted = granted_sockets(options.allow_write, os.environ)
    if granted and support.kind == "bwrap":
        parser.error(f"--sandbox required: --allow-write grants the socket "
                     f"{', '.join(map(str, granted))}, which turns off the filter that keeps "
                     "runs from every other Unix socket of yours (docs/security.md); drop "
                     "that grant, or use --sandbox auto to run them partly confined, said at "
                     "start and in each completion")


def _check_grants(parser: argparse.ArgumentParser, options: Options) -> None:
    """A grant that would uncover a hidden place (§13: ``--workdir ~``, an
    ``--allow-write`` holding ``$PROHOST_HOME`` or a secret store): exit 2 saying
    why and what to do."""
    from prohost.engine.agent.brains import brain_for
    from prohost.engine.run.confine import grant_problems

    owner = brain_for(options.brain, options.exec_command).folders_owner
    problems = grant_problems(options, Path(os.environ.get("HOME") or Path.home()), owner)
    if problems:
        parser.error("; ".join(problems))


def agent_run(ns: argparse.Namespace) -> int:
    from prohost.options import options_from_args

    parser: argparse.ArgumentParser = ns.parser
    try:
        options = options_from_args(ns, os.environ, Path.cwd())
    except OptionError as exc:
        parser.error(str(exc))
    _check_budget(parser, options)
    _check_sandbox(parser, options)
    _check_grants(parser, options)
    from rich.console import Console

    from prohost.engine.view.panel import use_panel
    from prohost.engine.view.termout import nonblocking

    # A terminal that stops reading must never stall the event loop (acks, pongs,
    # heartbeats): the panel and the log lines are written without blocking.
    console = Console(file=nonblocking(sys.stdout))
    live = use_panel(console, ns.no_panel)
    # With the panel, log lines must go through rich on the panel's console, or
    # they would tear its frame; they then print above it.
    setup_logging(ns.verbose, console=console if live else None,
                  stream=nonblocking(sys.stderr))
    from prohost.logfile import log_to_file, wants_file_logging

    if wants_file_logging(os.environ):  # the service unit sets PROHOST_LOG=file
        log_to_file(options.home, level=logging.DEBUG if ns.verbose else logging.INFO)
        # The journal / launchd.log then only gets what escapes logging.
        logging.getLogger("prohost").propagate = False
    # The single-instance lock and the credentials are the harness's first steps
    # (prohost.commands.agent), not ours: flock locks per open file, so taking it here too
    # would make the harness find its own home locked.
    from prohost.commands.agent import run_agent_command

    return run_agent_command(options, console=console, live=live)


def agent_install_daemon(ns: argparse.Namespace) -> int:
    from prohost.commands.daemon import install_daemon_command
    from prohost.login_env import check_pass_env
    from prohost.options import options_from_args

    parser: argparse.ArgumentParser = ns.parser
    try:
        # A service cannot be told later that a checkout is missing: refuse it now.
        options = options_from_args(ns, os.environ, Path.cwd(), require_checkouts=True)
        pass_env = check_pass_env(ns.pass_env, os.environ)
    except (OptionError, ValueError) as exc:
        parser.error(str(exc))
    _check_budget(parser, options)
    _check_sandbox(parser, options)
    _check_grants(parser, options)
    setup_logging(ns.verbose)
    return install_daemon_command(options, print_only=ns.print_only, env=os.environ,
                                  pass_env=pass_env)


def agent_uninstall_daemon(ns: argparse.Namespace) -> int:
    from prohost.commands.daemon import uninstall_daemon_command
    from prohost.home import prohost_home

    setup_logging(ns.verbose)
    return uninstall_daemon_command(os.environ, prohost_home(os.environ, Path.cwd()))


def agent_gc(ns: argparse.Namespace) -> int:
    import trio

    from prohost.commands.gc import DEFAULT_OLDER_THAN_DAYS, gc_command, parse_older_than
    from prohost.home import prohost_home

    parser: argparse.ArgumentParser = ns.parser
    try:
        days = (DEFAULT_OLDER_THAN_DAYS if ns.older_than is None
                else parse_older_than(ns.older_than))
    except ValueError as exc:
        parser.error(str(exc))
    setup_logging(ns.verbose)
    return trio.run(gc_command, prohost_home(os.environ, Path.cwd()), days, ns.dry_run, ns.force)


def agent_status(ns: argparse.Namespace) -> int:
    from prohost.commands.status import status_command
    from prohost.home import prohost_home

    return status_command(prohost_home(os.environ, Path.cwd()), as_json=ns.json)


def _count(parser: argparse.ArgumentParser, flag: str, raw: str | None,
           minimum: int) -> int | None:
    if raw is None:
        return None
    count = whole_number(raw, minimum)
    if count is None:
        parser.error(f"{flag} must be a whole number of {minimum} or more, of at most "
                     f"{MAX_COUNT_DIGITS} digits (got {raw!r})")
    return count


def agent_stop(ns: argparse.Namespace) -> int:
    from prohost.commands.runner import stop_command
    from prohost.home import prohost_home

    return stop_command(prohost_home(os.environ, Path.cwd()), now=ns.now)


def agent_cancel(ns: argparse.Namespace) -> int:
    from prohost.commands.runner import cancel_command
    from prohost.home import prohost_home

    return cancel_command(prohost_home(os.environ, Path.cwd()), ns.run)


def agent_logs(ns: argparse.Namespace) -> int:
    from prohost.commands.runner import logs_command
    from prohost.home import prohost_home

    lines = _count(ns.parser, "--lines", ns.lines, 0)
    return logs_command(prohost_home(os.environ, Path.cwd()), follow=ns.follow, lines=lines)


def agent_runs(ns: argparse.Namespace) -> int:
    from prohost.commands.runner import DEFAULT_LIMIT, runs_command
    from prohost.home import prohost_home

    limit = _count(ns.parser, "--limit", ns.limit, 1)
    return runs_command(prohost_home(os.environ, Path.cwd()), as_json=ns.json,
                        limit=DEFAULT_LIMIT if limit is None else limit, show=ns.show)


def agent_pair(ns: argparse.Namespace) -> int:
    import trio

    from prohost.commands.pair import pair_command
    from prohost.home import prohost_home

    parser: argparse.ArgumentParser = ns.parser
    code = ns.code.strip()
    try:
        if not code:
            raise OptionError(f"--code must be {PAIR_VALUES['--code']} (got an empty one)")
        url: str | None = None
        if ns.url is not None:
            url = check_url("--url", ns.url)
        elif os.environ.get("PROHOST_WS_URL", "").strip():
            url = check_url("$PROHOST_WS_URL", os.environ["PROHOST_WS_URL"])
        machine = check_machine(ns.machine) if ns.machine is not None else default_machine_name()
    except OptionError as exc:
        parser.error(str(exc))
    setup_logging(ns.verbose)
    return trio.run(pair_command, code, url, machine, prohost_home(os.environ))


def _parse_port(parser: argparse.ArgumentParser, raw: str) -> int:
    port = whole_number(raw, 0, 65535)
    if port is None:
        parser.error(f"--port must be {SERVER_VALUES['--port']} (got {raw!r})")
    return port


def _server_state_dir(ns: argparse.Namespace) -> Path | None:
    """--state, else $PROHOST_HOME/server; None with --no-state."""
    from prohost.home import make_private_home, prohost_home

    if ns.no_state:
        if ns.state is not None:
            ns.parser.error("--state and --no-state contradict each other; give one")
        return None
    if ns.state is None:
        home = prohost_home(os.environ, Path.cwd())
        try:
            # The home a harness would make, as private as the harness makes it.
            make_private_home(home)
        except OSError as exc:
            reason = exc.strerror or exc
            ns.parser.error(f"cannot make {home} for the server's pairings ({reason}); give "
                            "--state DIR or --no-state")
        return home / "server"
    if not ns.state.strip():
        ns.parser.error(f"--state must be {SERVER_VALUES['--state']} (got an empty one)")
    return Path(os.path.expanduser(ns.state.strip())).absolute()


def server(ns: argparse.Namespace) -> int:
    import trio

    port = _parse_port(ns.parser, ns.port)
    retries = whole_number(ns.retries, 0, 100)
    if retries is None:
        parser: argparse.ArgumentParser = ns.parser  # its error() never returns
        parser.error(f"--retries must be {SERVER_VALUES['--retries']} (got {ns.retries!r})")
    state_dir = _server_state_dir(ns)
    setup_logging(ns.verbose)
    from prohost.server.main import run_server_command

    return trio.run(run_server_command, ns.host, port, ns.faults, state_dir, retries,
                    ns.state is None and state_dir is not None)


def send(ns: argparse.Namespace) -> int:
    import trio

    setup_logging(ns.verbose)
    from prohost.commands.send import send_command

    return trio.run(send_command, ns.server, ns.text, ns.conversation, ns.wait, 600,
                    ns.fail_without_harness, ns.state)


def runs_verb(ns: argparse.Namespace) -> int:
    """``prohost runs show|cancel ID``."""
    import trio

    setup_logging(ns.verbose)
    from prohost.commands.runs import runs_cancel_command, runs_show_command

    if ns.verb == "show":
        return trio.run(runs_show_command, ns.server, ns.run_id, ns.json)
    return trio.run(runs_cancel_command, ns.server, ns.run_id, ns.reason, ns.state)


def demo(ns: argparse.Namespace) -> int:
    from rich.console import Console

    from prohost.commands.demo import main as demo_main
    from prohost.engine.view.panel import use_panel

    console = Console()
    # On a terminal the demo draws the live panel; log lines must then go through
    # its console to print above it.
    setup_logging(ns.verbose, console=console if use_panel(console, False) else None)
    return demo_main(console, keep=ns.keep)
