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
    VALUE_DESCRIPTIONS,
    OptionError,
    Options,
    check_machine,
    check_url,
    default_machine_name,
)

#: What the values of ``agent pair`` and ``server`` must be, for their errors.
PAIR_VALUES = {
    "--code": "the pairing code shown in the web app, e.g. ABCD-1234",
    "--url": VALUE_DESCRIPTIONS["--url"],
    "--machine": VALUE_DESCRIPTIONS["--machine"],
}
SERVER_VALUES = {
    "--host": "an address to listen on, e.g. 127.0.0.1 or 0.0.0.0",
    "--port": "a port number from 0 to 65535 (0 picks a free one)",
}


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1


def _check_budget(parser: argparse.ArgumentParser, options: Options) -> None:
    """--max-cost only with a brain that can bound a run's cost (§12): else exit 2."""
    if options.max_cost_usd is None:
        return
    from prohost.engine.agent.brains import BudgetRefused, brain_for

    try:
        brain_for(options.brain, options.exec_command, max_cost_usd=options.max_cost_usd)
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
                     f"{support.reason}. Run on a system that can (Linux 5.13 or later "
                     "with Landlock enabled, or macOS), or use --sandbox auto to run them "
                     "unconfined, said at start and in each completion")


def agent_run(ns: argparse.Namespace) -> int:
    from prohost.options import options_from_args

    parser: argparse.ArgumentParser = ns.parser
    try:
        options = options_from_args(ns, os.environ, Path.cwd())
    except OptionError as exc:
        parser.error(str(exc))
    _check_budget(parser, options)
    _check_sandbox(parser, options)
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
    digits = raw.strip()
    if digits.isascii() and digits.isdigit() and len(digits) <= 5 and int(digits) <= 65535:
        return int(digits)
    parser.error(f"--port must be {SERVER_VALUES['--port']} (got {raw!r})")


def server(ns: argparse.Namespace) -> int:
    import trio

    port = _parse_port(ns.parser, ns.port)
    setup_logging(ns.verbose)
    from prohost.server.main import run_server_command

    return trio.run(run_server_command, ns.host, port, ns.faults)


def send(ns: argparse.Namespace) -> int:
    import trio

    setup_logging(ns.verbose)
    from prohost.commands.send import send_command

    return trio.run(send_command, ns.server, ns.text, ns.conversation, ns.wait)


def demo(ns: argparse.Namespace) -> int:
    from rich.console import Console

    from prohost.commands.demo import main as demo_main
    from prohost.engine.view.panel import use_panel

    console = Console()
    # On a terminal the demo draws the live panel; log lines must then go through
    # its console to print above it.
    setup_logging(ns.verbose, console=console if use_panel(console, False) else None)
    return demo_main(console)
