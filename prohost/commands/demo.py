"""``prohost demo``: the whole system on this machine in under a minute.

A reference server on a free loopback port, a harness paired with it in a
throw-away home, and a small stand-in agent (:mod:`prohost.commands.demo_agent`) that works
for a random second or two and answers. A dozen requests across four
conversations go through the real path — signed deliveries, acks, the lane
scheduler at concurrency 4, real processes, the ledger, HTTP completions — and a
table of the results is printed at the end. With git installed, a small repository
in the temporary home is passed as ``--repos``: each conversation gets its own
worktree, the stand-in edits and commits there, and the table shows what each run
changed. Nothing is left behind, unless ``--keep`` asks for the repository (each
conversation's work on its branch ``prohost/<conversation>``) and the home.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import trio
from rich.console import Console
from rich.text import Text

from prohost.engine import lognames
from prohost.engine.harness import Harness
from prohost.engine.ledger import Ledger
from prohost.engine.link.connection import Endpoints
from prohost.engine.report.sender import open_sender
from prohost.engine.view.panel import Panel, use_panel
from prohost.engine.view.reporttext import changes_summary
from prohost.engine.view.statustext import cost_text, tokens_text
from prohost.home import LEDGER_FILE, Credentials, resolve_endpoints, save_credentials
from prohost.invocation import command
from prohost.options import Options
from prohost.server import ServerConfig, ServerHandle, serve
from prohost.wire.usage import Usage

log = logging.getLogger("prohost.demo")
progress_log = logging.getLogger(lognames.RUNS)

CONVERSATIONS = {
    "design-review": ["Summarise the open review comments", "Which one is riskiest?",
                      "Draft a reply to the riskiest one"],
    "ci-red": ["Why is CI red on main?", "Fix the flaky test", "Open a note for the team"],
    "release": ["What changed since 0.9?", "Write the changelog entry", "Tag the release"],
    "onboarding": ["Explain the lane scheduler", "How do I run the tests?",
                   "Where are the logs?"],
}

#: Upper bound for the whole demo; it normally takes a few seconds.
DEMO_DEADLINE_S = 50.0


def main(console: Console | None = None, *, keep: bool = False) -> int:
    """Run the demo; 0 when every run came back, 1 otherwise. ``keep``: leave its
    folder (repository and home) behind, and say where."""
    # The server's own bookkeeping would drown the harness's progress lines.
    logging.getLogger("prohost.server").setLevel(logging.WARNING)
    return trio.run(functools.partial(run_demo, console or Console(), keep=keep))


@contextlib.contextmanager
def _demo_folder(keep: bool) -> Iterator[str]:
    """A fresh temporary folder, removed at the end unless ``keep``."""
    if keep:
        yield tempfile.mkdtemp(prefix="prohost-demo-")
        return
    with tempfile.TemporaryDirectory(prefix="prohost-demo-") as tmp:
        yield tmp


async def run_demo(console: Console, *, keep: bool = False) -> int:
    """The demo in the caller's trio run. Cancelling it stops the server and the
    harness (their agents are killed) and removes the temporary home (unless
    ``keep``)."""
    with _demo_folder(keep) as tmp, trio.fail_after(DEMO_DEADLINE_S):
        home = Path(tmp) / "home"
        repo = await trio.to_thread.run_sync(_demo_repository, Path(tmp) / "demo-repo", console)
        async with trio.open_nursery() as nursery:
            server: ServerHandle = await nursery.start(serve, ServerConfig(heartbeat_s=5))
            console.print(f"[bold]reference server[/] on {server.http_url}")
            credentials = server.pair("demo")
            creds = Credentials(
                token=credentials["token"], secret=credentials["secret"],
                ws_url=credentials["ws_url"], api_url=credentials.get("api_url"),
                account=credentials.get("account"),
            )
            save_credentials(home, creds)
            ws_url, api_base = resolve_endpoints(None, creds)
            options = Options(
                home=home,
                machine="demo",
                exec_command=f"{sys.executable} -m prohost.commands.demo_agent",
                # It speaks Claude Code's stream-json (pretend usage included); it
                # needs no permission flag, so none is passed (not even as root).
                brain="claude",
                safe_tools=True,
                concurrency=4,
                timeout_s=60,
                idle_timeout_s=30,
                repos=(repo,) if repo is not None else (),
            )
            ledger = Ledger.open(home / LEDGER_FILE)
            try:
                async with open_sender(api_base) as client:
                    harness = Harness(
                        options,
                        Endpoints(ws_url=ws_url, api_base=api_base, token=creds.token,
                                  secret=creds.secret),
                        client=client,
                        ledger=ledger,
                    )
                    exited = trio.Event()

                    async def run_harness() -> None:
                        await harness.run()
                        exited.set()

                    nursery.start_soon(run_harness)
                    progress_log.setLevel(logging.WARNING)  # the panel says it instead
                    panel = Panel(console, harness.snapshot, live=use_panel(console, False),
                                  changes=harness.state_changed)
                    # Its own nursery, so the panel has stopped (its last frame drawn)
                    # before the results table is printed under it.
                    async with trio.open_nursery() as panel_nursery:
                        await panel_nursery.start(panel.run)
                        await server.wait_until(lambda state: state.connected > 0)
                        run_ids = await _submit_all(server, console)
                        await server.wait_until(
                            lambda state: all(
                                state.runs[r].state in ("completed", "failed") for r in run_ids
                            )
                        )
                        harness.drain()
                        await exited.wait()
                        panel_nursery.cancel_scope.cancel()
            finally:
                ledger.close()
            ok = _print_results(server, run_ids, console)
            server.shutdown()
        if keep:
            await trio.to_thread.run_sync(_say_kept, Path(tmp), home, repo, console)
        else:
            # The command on a line of its own, whole: a long path must not wrap it.
            console.print("[dim]to keep its repository and home to look at afterwards:[/]")
            console.print(f"[dim]  {command('demo', '--keep')}[/]", soft_wrap=True,
                          highlight=False)
    return 0 if ok else 1


def _say_kept(folder: Path, home: Path, repo: Path | None, console: Console) -> None:
    """Where the kept demo is, and how to look at it: one fact a line, the commands
    whole (long paths wrap, but copy as one line)."""
    say = functools.partial(console.print, soft_wrap=True, highlight=False)
    say(f"kept in {folder}:")
    if repo is not None:
        listed = subprocess.run(
            ["git", "-C", str(repo), "branch", "--list", "--format=%(refname:short)",
             "prohost/*"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
            check=False)
        branches = listed.stdout.split()
        # Each conversation's work is on its own branch (its worktree's).
        say(f"  repository {repo}, one branch per conversation:")
        for branch in branches:
            say(f"    {branch}")
        if branches:
            say(f"  see one:   git -C {repo} log --oneline main..{branches[0]}")
    say(f"  its runs:  PROHOST_HOME={shlex.quote(str(home))} {command('agent', 'runs')}")
    say(f"  remove it: rm -rf {folder}")


async def _submit_all(server: ServerHandle, console: Console) -> list[str]:
    run_ids: list[str] = []
    # Interleaved, as people would type: turn 1 of every conversation, then turn 2…
    for turn in range(3):
        for conversation, texts in CONVERSATIONS.items():
            run_ids.append(await server.submit_run(texts[turn], conversation_id=conversation,
                                                   author="demo"))
    console.print(f"submitted {len(run_ids)} runs in {len(CONVERSATIONS)} conversations: up to "
                  "4 run at once, one at a time in each")
    return run_ids


def _print_results(server: ServerHandle, run_ids: list[str], console: Console) -> bool:
    """Two lines per run, each cut (never wrapped) at the terminal's width: at 80
    columns a table of seven columns wrapped its cells one word per line."""
    console.print(Text("prohost demo results", style="bold"))
    completed = 0
    for run_id in run_ids:
        record = server.run(run_id)
        completion = record.completion or {}
        done = record.state == "completed"
        completed += done
        duration = completion.get("duration_ms")
        line = Text("✓ " if done else "✗ ", style="green" if done else "red")
        line.append(f"{_cut(record.conversation_id or run_id, 14):<14} ")
        line.append(f"{duration / 1000:>4.1f} s  " if isinstance(duration, int) else "   - s  ")
        line.append(f"{_cut(changes_summary(completion.get('changes')) or '-', 26):<26}  ")
        line.append(_usage_cell(completion.get("usage")), style="dim")
        reply = " ".join(str(completion.get("reply") or completion.get("error") or "").split())
        for text in (line, Text(f"  {reply}", style="" if done else "red")):
            console.print(text, no_wrap=True, overflow="ellipsis", crop=True)
    console.print(Text("usage: pretend figures the demo's stand-in agent reports",
                       style="dim"))
    console.print(f"{completed} of {len(run_ids)} runs completed")
    return completed == len(run_ids)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _demo_repository(path: Path, console: Console) -> Path | None:
    """A small git repository for ``--repos`` (one commit: a README and notes), or
    ``None`` (said on the console) when git cannot make one."""
    if shutil.which("git") is None:
        console.print("git is not installed: the demo runs without --repos")
        return None
    path.mkdir()
    (path / "README.md").write_text("# demo\n\nA repository the demo's agent works in.\n")
    (path / "notes.md").write_text("# Notes\n\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="prohost demo", GIT_AUTHOR_EMAIL="demo@prohost.invalid",
               GIT_COMMITTER_NAME="prohost demo", GIT_COMMITTER_EMAIL="demo@prohost.invalid")
    try:
        for command in (["init", "-q", "-b", "main"], ["add", "-A"],
                        ["commit", "-q", "-m", "The demo repository"]):
            subprocess.run(["git", "-C", str(path), *command], env=env, check=True,
                           stdin=subprocess.DEVNULL, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        console.print(f"could not make a git repository for the demo ({exc}): "
                      "it runs without --repos")
        return None
    console.print(f"each conversation gets its own worktree of {path}")
    return path


def _usage_cell(usage: object) -> str:
    """``1.2k tok $0.0042``: a run's (pretend) usage, short."""
    found = Usage.from_json(usage)
    if found.to_json() is None:
        return "-"
    parts = [f"{tokens_text((found.input_tokens or 0) + (found.output_tokens or 0))} tok"]
    if found.cost_usd is not None:
        parts.append(cost_text(found.cost_usd))
    return " ".join(parts)
