#!/usr/bin/env python3
"""The mutation check (issue 27, point 9): does the fault matrix catch what it claims?

Usage: .venv/bin/python scripts/mutation_check.py [--quick] [--only NAME ...] [--list]
                                                  [--workers N] [--timeout S]

Each breakage below is a named, exact textual edit of the production code (``prohost/…``)
that breaks one promise of docs/reliability.md ("nothing lost, nothing twice"). One at
a time, the edit is applied to a temporary copy of the tree (never to this one), and
the fault matrix and its neighbours (:data:`TESTS`, a fixed list) run against that
copy with ``-x -q -n 2`` (``--workers``: another count, 1 to leave a shared
machine's other CPU alone). The breakage is *caught* when a test fails. A run that
hangs past its time limit is not a catch: it is a failure of the check (``hung``),
since a test that hangs instead of failing shows nothing about which promise broke.

A table is printed: breakage, where (file and edited line), caught or not, and by
which test. Exit 1 when a breakage is not caught or its run hung, or when an edit no longer applies
(its old text does not occur exactly once: the code moved; fix the list so that it
stays true). Before the breakages, the untouched copy runs once: if it fails, the
check means nothing, and it exits 2.

``--quick``: only the breakages of :data:`QUICK`. ``--only NAME`` (repeatable): only
that breakage, to see on its own what catches it (or why nothing does).
tests/scripts/test_mutation_check.py checks, in every default run, that every edit
still applies to today's code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` (which must occur exactly once in ``path``) by ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Breakage:
    name: str
    edits: tuple[Edit, ...]
    why: str  # the promise it breaks
    #: Not empty: an equivalent mutant — the edit cannot change what any process,
    #: file or frame does, for the reason given — run and shown, never a failure.
    equivalent: str = ""


def _one(path: str, old: str, new: str) -> tuple[Edit, ...]:
    return (Edit(path, old, new),)


STEPS = "prohost/engine/ledger/steps.py"
STORE = "prohost/engine/ledger/store.py"
RECOVERY = "prohost/engine/supervisor/recovery.py"
PROCESS = "prohost/engine/agent/process.py"
HARNESS = "prohost/engine/harness.py"
RUNNER = "prohost/engine/run/runner.py"
ATTEMPTS = "prohost/engine/run/attempts.py"
EXECUTE = "prohost/engine/run/execute.py"
ADMISSION = "prohost/engine/supervisor/admission.py"
SERVER_STATE = "prohost/server/state.py"
CHANGES = "prohost/engine/repos/changes.py"

_STARTED_READ = "                raise  # the read failed, not the step (as from a worker thread)\n"
_STARTED_WRITE = (
    '            raise StepNotWritten(f"the ledger step mark_started could not be written: "\n'
    '                                 f"{exc}") from exc\n'
    "\n"
    "    def _started_then_session("
)

BREAKAGES: tuple[Breakage, ...] = (
    Breakage(
        "started: write error swallowed",
        _one(STEPS, _STARTED_WRITE,
             "            return None\n\n    def _started_then_session("),
        "a failed `started` write is ignored and the agent spawned (§7: never skipped)",
    ),
    Breakage(
        "started: read error swallowed",
        _one(STEPS, _STARTED_READ, "                return None\n"),
        "a failed session read after `started` is taken as 'no session'",
    ),
    Breakage(
        "started: both errors swallowed",
        _one(STEPS,
             "        except (LedgerError, OSError, sqlite3.Error) as exc:\n"
             "            if exc is job.then_error:\n",
             "        except (LedgerError, OSError, sqlite3.Error) as exc:\n"
             "            return None\n"
             "            if exc is job.then_error:\n"),
        "any error of the `started` hand-off is ignored and the agent spawned",
    ),
    Breakage(
        "record_pgid failure only logged",
        _one(STEPS,
             '            raise StepNotWritten(f"the ledger step record_pgid could not be '
             'written: "\n                                 f"{exc}") from exc\n',
             '            log.error("ledger: record_pgid could not be written: %s", exc)\n'),
        "an agent whose group is not durable keeps running (§7)",
    ),
    Breakage(
        "ledger step bound 1e9 s",
        _one(STEPS, "LEDGER_STEP_TIMEOUT_S = 30.0\n", "LEDGER_STEP_TIMEOUT_S = 1e9\n"),
        "a step on a hung disk holds its run forever",
    ),
    Breakage(
        "no fsync in the group commit (FULL → OFF)",
        (Edit("prohost/engine/ledger/schema.py",
              'conn.execute("PRAGMA synchronous = FULL")',
              'conn.execute("PRAGMA synchronous = OFF")'),
         Edit("prohost/engine/ledger/writer.py",
              "conn.execute(f\"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}\")",
              "conn.execute(f\"PRAGMA synchronous = {'OFF' if durable else 'NORMAL'}\")")),
        "a durable step is not fsync'd before the harness acts on it",
    ),
    Breakage(
        "finished posted before it is written",
        # The report moves ahead of `finished` (posted once, as before): a kill -9
        # between the two leaves the run `started`, and the restart reports it again.
        (Edit(RUNNER,
              "                    outcome, turn = await self.outcome_of(held, batcher)\n"
              "                    await self._finish(held, outcome, turn)\n",
              "                    outcome, turn = await self.outcome_of(held, batcher)\n"
              "                    await self._report(held, outcome)\n"
              "                    await self._finish(held, outcome, turn)\n"),
         Edit(RUNNER,
              "                    nursery.cancel_scope.cancel()\n"
              "                await self._report(held, outcome)\n",
              "                    nursery.cancel_scope.cancel()\n")),
        "a crash between the post and `finished` reports the run twice, differently",
    ),
    Breakage(
        "no PROHOST_RUN_ID fallback in restart's kill",
        _one(RECOVERY,
             "    groups += [pgid for pgid in groups_of_run(row.run_id) if pgid not in groups]\n",
             "    groups += []\n"),
        "an agent whose group was never committed outlives the restart",
    ),
    Breakage(
        "agent left running when its group write fails",
        # Two edits: `start_agent`'s own `finally` kills the group too (defence in
        # depth); with only the first, nothing a test can see changes. The first
        # stops the group on a cancel only, not when the caller's step after the
        # spawn (the group's write) raises.
        (Edit(PROCESS,
              "            try:\n"
              "                yield watch\n"
              "            except BaseException:\n",
              "            try:\n"
              "                yield watch\n"
              "            except trio.Cancelled:\n"),
         Edit(PROCESS,
              "        # Whatever happened above, nothing of this group may outlive the call.\n"
              "        _killpg(pgid, signal.SIGKILL)\n",
              "        pass\n")),
        "the group of a run reported as an internal error keeps running",
    ),
    Breakage(
        "group recorded after the agent exits",
        _one(EXECUTE,
             "            await on_spawn(agent)\n"
             "            result = await agent.finish()\n",
             "            result = await agent.finish()\n"
             "            await on_spawn(agent)\n"),
        "a kill -9 while the agent runs leaves no group for the restart",
    ),
    Breakage(
        "200 when accepted fails",
        _one(ADMISSION,
             "            # has is answered from it rather than refused.\n"
             "            return await self._known_or_refused(run, NOT_RECORDED, "
             "unreadable=NOT_RECORDED)\n",
             "            # has is answered from it rather than refused.\n"
             '            return intake.ACCEPTED, "accepted"\n'),
        "a delivery not recorded is acked: lost",
    ),
    Breakage(
        "restart re-queues started rows",
        _one(RECOVERY,
             "            self.queue.settle(held, Outcome.failure(interrupted, retryable=True))\n",
             "            self.queue.put(held, row.body)\n"),
        "a run that may have run is run again after a restart",
    ),
    Breakage(
        "second signal does not hurry steps",
        _one(HARNESS,
             "        self.bounds.hurry(self._stop_deadline)  # steps stuck on a hung disk "
             "give up too\n",
             "        pass\n"),
        "a step on a hung disk holds the second signal past its 5 s",
    ),
    Breakage(
        "record_pgid not fsync'd",
        # Still waited for (waits=True), only its commit not fsync'd: the pure bug.
        _one(STORE, '        self._write(write, what="record_pgid")\n',
             '        self._write(write, what="record_pgid", durable=False, waits=True)\n'),
        "a kill of the machine after the spawn leaves no group for the restart",
    ),
    Breakage(
        "restart ignores the recorded group",
        _one(RECOVERY,
             "    if row.pgid is not None and process_belongs_to_run(row.pgid, row.run_id):\n",
             "    if False:\n"),
        "the restart kills only what it finds by PROHOST_RUN_ID",
        equivalent="since issue 27 point 2 the restart always searches every process "
        "for the run's PROHOST_RUN_ID, and keeps the recorded group only when its "
        "leader carries that id, so the search finds that group either way (only an "
        "agent caught inside execve is looked at twice)",
    ),
    Breakage(
        "accepted acked before its fsync",
        # Still waited for before the ack (waits=True), only not fsync'd.
        _one(STORE, '        admission: Admitted = self._write(write, what="admit")\n',
             '        admission: Admitted = self._write(write, what="admit", durable=False, '
             'waits=True)\n'),
        "an acked run is lost with the machine",
    ),
    Breakage(
        "20 s stop window",
        _one(HARNESS, "STOP_WINDOW_S = 5.0\n", "STOP_WINDOW_S = 20.0\n"),
        "the second signal takes 20 s, not 5 (§9)",
    ),
    Breakage(
        "no drain hand-back of gate waiters",
        _one(HARNESS,
             "        self.gate.turn_away(Outcome.failure(NOT_STARTED, retryable=True))\n",
             "        pass\n"),
        "runs waiting for an account hold a drain up to --limit-wait (§9)",
    ),
    Breakage(
        "a second signal overwrites a cancel",
        _one(HARNESS,
             "                if held.stop_outcome is None:\n"
             "                    held.stop_outcome = Outcome.failure(STOPPED, retryable=True)\n",
             "                held.stop_outcome = Outcome.failure(STOPPED, retryable=True)\n"),
        "a cancelled run is reported stopped (retryable) and run again (§6)",
    ),
    Breakage(
        "a cancel not kept in the ledger",
        _one(HARNESS,
             "            await self.steps.cancelled(held.run_id, outcome.to_json())\n",
             "            pass\n"),
        "a kill -9 during a cancel's stop reports the run restarted, retryable (§6)",
    ),
    Breakage(
        "the reference server retries cancelled runs",
        _one(SERVER_STATE, "            if run.cancel_requested:\n", "            if False:\n"),
        "a cancelled request reported retryable is submitted again (§6, §11)",
    ),
    Breakage(
        "a stopped run drops its changes",
        _one(RUNNER, "            if tally.changes is not None:\n", "            if False:\n"),
        "a cancelled or stopped run's completion has no `changes` (§7)",
    ),
    Breakage(
        "a cancel overrides a finished agent",
        # The runner's mark, not one of the harness's two checks of it (either
        # alone still keeps the reply: the cancel is taken, its stop is not made).
        _one(ATTEMPTS, "                held.agent_ended = True\n", "                pass\n"),
        "a run whose agent exited with its reply is reported cancelled (§6)",
        equivalent="since the agent's watch says when its leader exited (leader_exited, issue "
        "37), that mark is set first and keeps the reply by itself; this one only "
        "repeats it once the outcome is known (its own breakage is 'a cancel in the "
        "leader's exit window overrides a finished agent')",
    ),
    Breakage(
        "a restart forgets where the run began",
        # The start state is not written with the process group: the restart
        # finds none, and reports the run without what it changed.
        _one(ATTEMPTS, "        start_state = checkouts.start_state()\n",
             "        start_state = None\n"),
        "a run a kill -9 interrupted is reported restarted without its `changes` (§7)",
    ),
    Breakage(
        "a cancel in the leader's exit window overrides a finished agent",
        # The watch never says that the leader exited: a cancel while what the
        # agent left gets the grace stops the run, its reply lost.
        _one(PROCESS, "        self.leader_exited = True\n", "        pass\n"),
        "a run whose agent exited with its reply, its group not yet empty, is "
        "reported cancelled (§6)",
    ),
    Breakage(
        "a group deaf to SIGTERM is never SIGKILLed",
        # Neither the stop after the grace nor run_agent's last sweep: an agent
        # that never got to exec (hung opening a FIFO) and ignores SIGTERM lives on.
        (Edit(PROCESS,
              "        _killpg(self.pgid, signal.SIGKILL)\n        await self._pump(self._gone)\n",
              "        await self._pump(self._gone)\n"),
         Edit(PROCESS, "        _killpg(pgid, signal.SIGKILL)\n        groups.discard(pgid)\n",
              "        groups.discard(pgid)\n")),
        "a run's deadline or cancel leaves its hung agent running (§6, §13)",
    ),
    # Issue 37 point 11: edges of recent features no test guarded. (The ACP brain's
    # "a running total that went down" is guarded by tests/engine/run/test_edges.py;
    # its edit would be in brains/acp.py, left out here while that file moves. A
    # scratch folder never removed is caught by test_mcp_config_is_private_..., but
    # an earlier test of TESTS hangs on it first: a hang is no catch, so it is not
    # listed until that test fails instead.)
    Breakage(
        "a committed rename reported uncommitted",
        _one(CHANGES,
             "        committed = value == head_now(name) and (source is None or "
             "head_now(source) is None)\n",
             "        committed = value == head_now(name) and source is None\n"),
        "a rename the run committed is reported `committed: false` (§7)",
    ),
    Breakage(
        "an untracked file in a submodule dropped",
        _one(CHANGES,
             '            dirty = "+dirty" if "M" in sub[2:] or "U" in sub[2:] else ""\n',
             '            dirty = "+dirty" if "M" in sub[2:] else ""\n'),
        "a submodule holding only new files is missing from `changes` (§7)",
    ),
    Breakage(
        "agent logs -n 0 prints the whole log",
        _one("prohost/commands/runner.py",
             "            shown = shown[-lines:] if lines else []\n",
             "            shown = shown[-lines:]\n"),
        "`-n 0` prints every line instead of none",
    ),
    Breakage(
        "a pairing code spent when its pairing could not be saved",
        _one(SERVER_STATE,
             "        harness = self.pair(machine)  # raises (code unspent) when it cannot be "
             "saved\n"
             "        used, self.pairing_code = self.pairing_code, generate_pairing_code()\n"
             "        self.used_codes.add(used.upper())\n",
             "        used, self.pairing_code = self.pairing_code, generate_pairing_code()\n"
             "        self.used_codes.add(used.upper())\n"
             "        harness = self.pair(machine)\n"),
        "a failed pairing uses the code up (§10)",
    ),
    Breakage(
        "the retry delay never doubles",
        _one(SERVER_STATE,
             "        delay = min(RETRY_CAP_S, self.retry_first_s * 2 ** (run.attempt - 1))\n",
             "        delay = min(RETRY_CAP_S, self.retry_first_s)\n"),
        "the reference server retries a failing run every second (§11)",
    ),
    Breakage(
        "restart skips the /proc search while the recorded group lives",
        _one(RECOVERY,
             "    groups += [pgid for pgid in groups_of_run(row.run_id) if pgid not in groups]\n",
             "    groups += [] if groups else groups_of_run(row.run_id)\n"),
        "a later attempt's agent outlives the restart while an earlier group lives (§7)",
    ),
    Breakage(
        "no outbox retry on reconnect",
        _one(HARNESS,
             "        if self.outbox is not None:\n"
             "            self.outbox.poke()\n"
             "        await self.beacon.serve(",
             "        await self.beacon.serve("),
        "a report waiting in the outbox waits 5 minutes after a reconnect (§7)",
    ),
)

#: The subset for CI's slow step (``--quick``): one per kind of promise.
QUICK: tuple[str, ...] = (
    "started: write error swallowed",
    "record_pgid failure only logged",
    "no PROHOST_RUN_ID fallback in restart's kill",
    "agent left running when its group write fails",
    "200 when accepted fails",
    "restart re-queues started rows",
    "second signal does not hurry steps",
)

#: The fault matrix and its neighbours, run against each broken copy.
TESTS: tuple[str, ...] = (
    "tests/engine/ledger/test_fault_matrix.py",
    "tests/engine/ledger/test_full_filesystem.py",
    "tests/engine/ledger/test_writer_thread.py",
    "tests/engine/ledger/test_writer_restarts.py",
    "tests/engine/ledger/test_group_commit.py",
    "tests/engine/ledger/test_withdrawn_admits.py",
    "tests/engine/ledger/test_sqlite_ledger.py",
    "tests/engine/test_blocking_bounds.py",
    "tests/engine/test_signals_final_status.py",
    "tests/harness/test_hung_disk.py",
    "tests/harness/test_hung_ledger_writes.py",
    "tests/harness/test_faults_in_a_run.py",
    "tests/process/test_restart.py",
    "tests/process/test_signals.py",
    "tests/engine/supervisor/test_admission.py",
    "tests/engine/supervisor/test_admission_in_runs.py",
    "tests/engine/supervisor/test_redelivery_never_503.py",
    "tests/engine/supervisor/test_recovery.py",
    "tests/engine/supervisor/test_recovery_during_a_drain.py",
    "tests/engine/report/test_outbox.py",
    "tests/engine/report/test_outbox_in_runs.py",
    "tests/engine/accounts/test_gate_at_a_drain.py",
    "tests/engine/ledger/test_durable_steps.py",
    "tests/harness/test_endings.py",
    "tests/harness/test_endings_restart.py",
    "tests/harness/test_endings_window.py",
    "tests/harness/test_endings_hung_spawn.py",
    "tests/server/test_reference_server.py",
    "tests/server/test_retryable_failures_retried.py",
    "tests/server/test_pairing_kept.py",
    "tests/engine/run/test_edges.py",
    "tests/engine/repos/test_changes_totals.py",
    "tests/engine/repos/test_changes_in_runs.py",
    "tests/commands/test_runner_commands.py",
    "tests/engine/agent/brains/test_brains_in_runs.py",
)

_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", ".cache", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
    "*.egg-info")


def check_edits(root: Path, breakage: Breakage) -> str | None:
    """Why ``breakage`` no longer applies to the tree at ``root``, or None."""
    for edit in breakage.edits:
        path = root / edit.path
        if not path.is_file():
            return f"{edit.path} is gone"
        count = path.read_text(encoding="utf-8").count(edit.old)
        if count != 1:
            return f"its old text occurs {count} times in {edit.path} (the code moved)"
    return None


def compiles(root: Path, breakage: Breakage) -> str | None:
    """Why ``breakage`` applied to the tree at ``root`` is not valid Python, or None:
    a broken copy that cannot even be imported proves nothing about the tests."""
    for edit in breakage.edits:
        path = root / edit.path
        text = path.read_text(encoding="utf-8").replace(edit.old, edit.new, 1)
        try:
            compile(text, str(path), "exec")
        except SyntaxError as exc:
            return f"the edited {edit.path} does not compile: {exc}"
    return None


def where(root: Path, breakage: Breakage) -> str:
    """``file:line`` of the first line each edit changes."""
    places = []
    for edit in breakage.edits:
        text = (root / edit.path).read_text(encoding="utf-8")
        at = text.find(edit.old)
        if at < 0:
            places.append(f"{edit.path}:?")
            continue
        old_lines, new_lines = edit.old.splitlines(), edit.new.splitlines()
        skip = 0
        while (skip < min(len(old_lines), len(new_lines))
               and old_lines[skip] == new_lines[skip]):
            skip += 1
        places.append(f"{edit.path}:{text.count(chr(10), 0, at) + 1 + skip}")
    return ", ".join(places)


def _sweep(copy: Path) -> None:
    """Kill what a broken copy's tests left running in sessions of their own (the
    agent a breakage leaves alive leads its own group, out of the run's session):
    every process whose command line names the copy. Linux's /proc; elsewhere none."""
    mark = str(copy).encode()
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    named = mark in cmdline.read()
            except OSError:
                continue
            if named:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry), signal.SIGKILL)


#: What a test run ended with: every test passed, one failed, or none answered in time.
PASSED, FAILED, HUNG = "passed", "failed", "hung"


def run_tests(copy: Path, timeout_s: float, workers: int = 2) -> tuple[str, str, float]:
    """Run :data:`TESTS` in ``copy`` with ``workers`` pytest-xdist workers: (PASSED,
    FAILED or HUNG, the first failing test or why, seconds)."""
    env = dict(os.environ, PYTHONPATH=str(copy), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", str(workers), "-p",
           "no:cacheprovider", *TESTS]
    began = time.monotonic()
    # Its own session, so that a hung run is ended with every worker and agent.
    with subprocess.Popen(cmd, cwd=copy, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as child:
        try:
            out, err = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return HUNG, f"(hung: no result in {timeout_s:.0f} s)", time.monotonic() - began
        finally:
            # Whatever a test left behind in the session goes too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            _sweep(copy)
    took = time.monotonic() - began
    if child.returncode == 0:
        return PASSED, "", took
    # "FAILED path::test[param with spaces] - message"
    failed = re.findall(r"^(?:FAILED|ERROR) (tests/.+?)(?: - .*)?$", out, re.MULTILINE)
    if failed:
        return FAILED, failed[0], took
    tail = (out + err).strip().splitlines()[-3:]
    return FAILED, f"(pytest exit {child.returncode}: {' / '.join(tail)})", took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the CI subset")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="only this breakage (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the breakages and exit")
    parser.add_argument("--workers", type=int, default=2, metavar="N",
                        help="pytest-xdist workers per test run (default 2)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per test run (default: 3 × the clean run + 60)")
    args = parser.parse_args(argv)
    chosen = [b for b in BREAKAGES
              if (not args.quick or b.name in QUICK) and (not args.only or b.name in args.only)]
    if args.list:
        for b in chosen:
            print(f"{b.name}: {where(ROOT, b)} — {b.why}")
        return 0
    if not chosen:
        print("no breakage chosen", file=sys.stderr)
        return 2
    # Stopped: the temporary copy is removed, and the test run's session killed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[tuple[str, str, str, str]] = []
    bad = 0
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="prohost-mutation-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(ROOT, copy, ignore=_IGNORE, symlinks=True)
        # The copy's prohost must be the one imported, by the tests and their children.
        probe = subprocess.run(
            [sys.executable, "-c", "import prohost; print(prohost.__file__)"], cwd=copy,
            env=dict(os.environ, PYTHONPATH=str(copy)), capture_output=True, text=True)
        if not probe.stdout.strip().startswith(str(copy)):
            print(f"the copy's prohost is not the one imported: {probe.stdout}{probe.stderr}",
                  file=sys.stderr)
            return 2
        print(f"clean run of {len(TESTS)} test files…", flush=True)
        ended, why, clean_s = run_tests(copy, args.timeout or 1800, args.workers)
        if ended != PASSED:
            print(f"the untouched tree fails: {why}; the check means nothing", file=sys.stderr)
            return 2
        timeout_s = args.timeout or 3 * clean_s + 60
        print(f"clean run: {clean_s:.0f} s; each broken copy gets {timeout_s:.0f} s", flush=True)
        for b in chosen:
            stale = check_edits(copy, b) or compiles(copy, b)
            if stale is not None:
                rows.append((b.name, where(copy, b), "NO EDIT", stale))
                bad += 1
                print(f"{b.name}: does not apply: {stale}", flush=True)
                continue
            place = where(copy, b)
            originals = {e.path: (copy / e.path).read_text(encoding="utf-8") for e in b.edits}
            try:
                for e in b.edits:
                    path = copy / e.path
                    path.write_text(path.read_text(encoding="utf-8").replace(e.old, e.new, 1),
                                    encoding="utf-8")
                ended, by, took = run_tests(copy, timeout_s, args.workers)
            finally:
                for rel, text in originals.items():
                    (copy / rel).write_text(text, encoding="utf-8")
            caught = {PASSED: "no", FAILED: "yes", HUNG: "HUNG"}[ended]
            if ended == PASSED and b.equivalent:
                caught, by = "equivalent", b.equivalent
            else:
                # Not caught, or hung: a hang shows no test failing for the promise.
                bad += ended != FAILED
            rows.append((b.name, place, caught, by))
            print(f"{b.name}: caught {caught} {by} ({took:.0f} s)", flush=True)
    total = time.monotonic() - began
    print()
    print("| breakage | where | caught | by |")
    print("|----------|-------|--------|----|")
    for name, place, caught, by in rows:
        print(f"| {name} | `{place}` | {caught} | {f'`{by}`' if by else ''} |")
    caught_n = sum(r[2] == "yes" for r in rows)
    print(f"\n{caught_n} of {len(rows)} caught in {total / 60:.1f} min "
          f"(clean run {clean_s:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
