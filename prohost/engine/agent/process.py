"""Spawning and watching one agent process group (docs/protocol.md §5.3–5.4, §6, §9).

An agent CLI is not one process. ``claude -p`` starts MCP servers, a test runner
starts workers, and a careless agent leaves a dev server running in the
background. So every agent runs as the leader of its own session and process
group, and every signal goes to the whole group. The leader exiting is not the
end of the run's processes either: what it left in its group is sent SIGTERM and
given the grace to end by itself, its output still read (an ACP adapter's CLI
saves the session the next run resumes as it leaves: killed at once, under load it
had saved nothing), and then the group is swept with SIGKILL, however the leader
went. An empty group costs no wait.

Output is read as it comes, on both streams, into bounded buffers: an agent that
prints 50 MiB costs the harness the first ``max_stdout_bytes`` of stdout and one
stderr line, not 50 MiB (those bounded readers are :mod:`prohost.engine.agent.output`).
The pipes double as the signal that the group is really done: a process holds its
stdout and stderr until it exits, so end-of-file on both (after the leader is
reaped) means nothing that inherited them is still running.

All of it is done by the task that watches the agent, without tasks of its own:
at a 16-wide backlog, tasks and scheduler trips were a good part of a run's CPU.

Two steps, so that the caller can make the group durable between them without
being called back: :func:`start_agent` spawns the agent and yields its
:class:`AgentWatch` (its ``pgid`` known, its output not read yet), and
:meth:`AgentWatch.finish` watches it end. What the agent prints goes to an
:class:`~prohost.engine.agent.launch.Output`; that the leader has exited is the
watch's ``leader_exited``, for the caller's cancel path to read.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Literal

import attrs
import trio

from prohost.engine.agent import procinfo
from prohost.engine.agent.launch import (
    DEFAULT_LIMITS,
    LINGER_S,
    Conversation,
    Launch,
    Output,
    ProcessLimits,
)
from prohost.engine.agent.output import LastLine, LineSplitter
from prohost.engine.agent.poll import EXIT, poller_for
from prohost.engine.agent.spawn import (
    Report,
    Spawned,
    command_line,
    exit_status,
    namespace_leftovers,
    spawn_confined,
)

log = logging.getLogger("prohost.agentproc")

#: Bytes asked of a pipe per read. Larger than trio's default, so a flood of
#: output costs fewer wake-ups; it is also the most one read can add to memory.
_READ_SIZE = 256 * 1024

#: Time allowed, after the leader exits and the group is swept, for the pipes to
#: reach end-of-file. Only a process that left the group (``setsid``) while
#: holding them can use it up.
_DRAIN_S = 2.0

TimedOut = Literal["total", "idle"]

#: Without pidfds (macOS, Linux before 5.3): the pause before looking again whether
#: a process left in the group has ended (s).
_LOOK_AGAIN_S = 0.05

class ProcessGroups:
    """Live agent process groups of this harness (so shutdown can reach every one).

    ``grace_s`` is read whenever a group is about to be stopped, not when it was
    spawned, so lowering it (the harness does, to 3 s, on a second signal) applies
    to every run stopped from then on.
    """

    grace_s: float = 5.0

    def __init__(self) -> None:
        self._pgids: set[int] = set()

    def add(self, pgid: int) -> None:
        self._pgids.add(pgid)

    def discard(self, pgid: int) -> None:
        self._pgids.discard(pgid)

    def kill_all(self, sig: int) -> None:
        """Send ``sig`` to every live group; a group that is already gone is skipped."""
        for pgid in list(self._pgids):
            _killpg(pgid, sig)

    def __len__(self) -> int:
        return len(self._pgids)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._pgids))

    def __contains__(self, pgid: object) -> bool:
        return pgid in self._pgids


def kill_children() -> None:
    """SIGKILL every child of this process, and the group of each that leads one.

    For the very end of a stop (§9): a spawn caught between its fork and its exec
    (``chdir`` into a hung folder) is in no :class:`ProcessGroups` yet, and would
    otherwise exec its agent after the harness is gone. Reads ``/proc`` (Linux);
    elsewhere it does nothing.
    """
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[1]) == me:
            pid = int(entry)
            if int(fields[2]) == pid:  # its own group: start_new_session
                _killpg(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@attrs.frozen
class ProcessResult:
    """How one agent process ended, and the bounded part of what it printed."""

    exit_code: int | None
    """The leader's exit status; ``None`` when a signal ended it."""
    signal: int | None
    stdout: bytes
    """At most ``max_stdout_bytes`` from the start of stdout; see ``stdout_truncated``."""
    stdout_truncated: bool
    last_stderr_line: str
    """The last non-empty stderr line, stripped, at most 500 characters."""
    timed_out: TimedOut | None
    """Set when the harness stopped the process for a limit (then ``signal`` is usually set)."""
    duration_s: float
    overlong_lines: int = 0
    """Stdout lines longer than ``max_line_bytes`` that ``Output.line`` never saw."""
    stderr_tail: bytes = b""
    """The last 64 KiB of stderr, kept with the run (:mod:`prohost.engine.agent.stderrtail`)."""


async def _left_in(pgid: int) -> list[int] | None:
    """The processes of group ``pgid`` that have not finished (``None``: cannot be
    told). Cancelled: abandons the thread, whose reading of ``/proc`` ends by itself."""
    try:
        os.killpg(pgid, 0)
    except OSError:
        return []  # no process in it at all: the usual case, and no thread for it
    return await trio.to_thread.run_sync(procinfo.live_group_members, pgid,
                                         abandon_on_cancel=True)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the whole group has already exited
    except PermissionError:
        # Only possible if every member is gone and the id was reused by a group of
        # another user's processes: there is nothing of ours left to signal.
        log.debug("process group %d is no longer ours to signal", pgid)


class AgentWatch:
    """The state of one running agent: its buffers, its timers, and how to stop it.

    Made by :func:`start_agent` as soon as the process exists; its
    :attr:`leader_exited` is plain state a caller reads (a cancel that comes once
    the agent has finished must not take its ending away, §6).

    It is all done by the task that calls :meth:`finish`: a poller says which pipe
    (or the leader's exit) needs it, it handles that, and asks again
    (:mod:`prohost.engine.agent.poll`); a task per pipe and a watchdog would cost a
    good part of a run's CPU. The prompt is written at once when it fits in the
    pipe's buffer (64 KiB on Linux), the rest as the agent reads it, so an agent
    that reads its prompt only while printing cannot wait on the harness while
    the harness waits on it. The total and idle limits are one cancel scope.
    """

    def __init__(
        self,
        proc: trio.Process | Spawned,
        *,
        stdin_data: bytes,
        groups: ProcessGroups,
        deadline: float,
        idle_timeout_s: float,
        max_stdout_bytes: int,
        max_line_bytes: int,
        output: Output | None,
        conversation: Conversation | None = None,
        report: Report | None = None,
    ) -> None:
        self.proc = proc
        #: The leader has exited, whatever ended it but a cancellation (a limit's
        #: stop too), though the rest of its group may not have yet: from then on
        #: the agent has finished, and a cancel must not take its ending away (§6).
        self.leader_exited = False
        self.conversation = conversation
        #: stdin gets end-of-file once what is queued is written (a conversation
        #: says when; a prompt is all there is).
        self.close_when_sent = conversation is None
        self.writing = False
        self.stdin_closed = False
        #: When a conversation that closed stdin stops waiting for the agent to exit.
        self.linger_until = math.inf
        self.scope: trio.CancelScope | None = None
        self.stdin = _pipe(proc.stdin, "stdin")
        self.stdout_fd = _pipe(proc.stdout, "stdout").fileno()
        self.stderr_fd = _pipe(proc.stderr, "stderr").fileno()
        self.output = output
        self.pgid = proc.pid
        #: What is queued for stdin and not written yet (appended to in place: an
        #: agent that reads slowly must not make each write copy the whole queue).
        self.unsent = bytearray(stdin_data)
        self.groups = groups
        self.deadline = deadline
        self.idle_timeout_s = idle_timeout_s
        self.max_stdout_bytes = max_stdout_bytes
        self.started_at = trio.current_time()
        self.last_output = self.started_at
        self.stdout = bytearray()
        self.stdout_truncated = False
        self.stderr = LastLine()
        self.lines = None if output is None or not output.reads_lines else LineSplitter(
            output.line, max_line_bytes,
            getattr(conversation, "overlong", None))  # ACP: AcpTurn.overlong
        self.open_pipes = 2
        #: The pipes read to their end-of-file (no longer watched).
        self.ended: set[int] = set()
        #: What the leader left in its group and is waited for: pidfd → pid.
        self.members: dict[int, int] = {}
        self.exited = False
        self.timed_out: TimedOut | None = None
        self.poller = poller_for(proc)
        #: The process watched is bubblewrap, whose PID namespace holds the run
        #: (:mod:`prohost.engine.agent.spawn`): its exit is the agent's, and the
        #: pipes' end the namespace's; this is what it says of that namespace.
        self.report = report

    def _begin(self) -> None:
        """Watch the pipes, and start writing the prompt (or the conversation);
        nothing is read until :meth:`finish`, the pipes buffering it meanwhile."""
        self.poller.read(self.stdout_fd)
        self.poller.read(self.stderr_fd)
        if self.conversation is not None:
            self.conversation.open(self)
        else:
            self._send_queued()

    async def finish(self) -> ProcessResult:
        """Watch the agent until its whole group has ended, and say how it ended (see
        :func:`start_agent`; a limit that passed before this was called stops the
        group at once).

        Cancelled: :func:`start_agent`'s exit stops the group (shielded, bounded).
        """
        await self._wait_leader()
        # Set before anything else is awaited: from now on the agent has finished,
        # and a cancel must not take its ending away (§6).
        self.leader_exited = True
        # The leader is gone; anything it left in its group goes too.
        await self._let_the_rest_end()
        _killpg(self.pgid, signal.SIGKILL)
        if self.open_pipes:
            with trio.move_on_after(_DRAIN_S):
                await self._pump(lambda: not self.open_pipes)
        if self.lines is not None:
            self.lines.close()
        self.stderr.close()
        code = exit_status(self.proc.returncode, namespaced=self.report is not None)
        result = ProcessResult(
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            stdout=bytes(self.stdout),
            stdout_truncated=self.stdout_truncated,
            last_stderr_line=self.stderr.text,
            timed_out=self.timed_out,
            duration_s=trio.current_time() - self.started_at,
            overlong_lines=self.lines.dropped if self.lines is not None else 0,
            stderr_tail=self.stderr.tail.data(),
        )
        # The watch outlives this (a run reads its leader_exited until it is
        # reported): the output it kept does not.
        self.stdout = bytearray()
        return result

    async def _wait_leader(self) -> None:
        """Return once the leader has exited, stopping the group first if a limit passes.

        The limits are a cancel scope's deadline, armed at the earlier of the total
        deadline and the idle one as it stood then. Output does not move it (that
        would cost a heap update per read): when it fires, the time is checked
        again, and if output came since, it is armed anew. It is armed once
        :meth:`finish` is called (the caller's step after the spawn runs before): a
        limit that passed by then stops the group at once.
        """
        while True:
            with trio.CancelScope(deadline=self._limit()) as self.scope:
                await self._pump(lambda: self.exited)
                return
            # Only this scope's own deadline gets here: a cancellation of the run
            # is not caught by it, and goes on to run()'s shielded stop.
            now = trio.current_time()
            if now >= self.linger_until and now < self.deadline:
                # The conversation was over and the agent did not exit: not a
                # limit of the run, so no timed_out.
                with trio.move_on_after(self._stop_bound()):
                    await self._stop()
                await self._pump(lambda: self.exited)
                return
            if now >= self.deadline:
                self.timed_out = "total"
            elif self.idle_timeout_s > 0 and now >= self.last_output + self.idle_timeout_s:
                self.timed_out = "idle"
            else:
                continue  # output came since the scope was armed
            with trio.move_on_after(self._stop_bound()):
                await self._stop()
            # SIGKILLed by now, unless the stop ran out of time before the grace did
            # (only waiting for the pipes can take that long): it is exiting.
            await self._pump(lambda: self.exited)
            return

    async def _let_the_rest_end(self) -> None:
        """After the leader's exit: SIGTERM what it left in its group, and wait up
        to the grace for it to end by itself, reading the pipes meanwhile (a member
        blocked on a full pipe could not end). Returns at once when nothing but
        zombies is left, the usual case; the caller's SIGKILL sweeps the rest.

        Each one left is waited for through a pidfd in the same poller as the
        pipes, so an end is noticed when it happens and no timer of trio's is
        needed for it (a test's still clock never ends the wait early or late).

        Under bubblewrap, the pipes' end says the run's namespace is empty (its init
        held them), the usual case, and then nothing is looked up; else its init is
        in the group, waiting for what is left, and what is left in the namespace
        outside the group (``setsid``) gets the SIGTERM too.

        Cancelled: stops waiting; the caller's stop sweeps the group.
        """
        if self.report is not None:
            self._read_ready()
            if self.open_pipes and self.report.init_is_ending():
                with trio.move_on_after(self.groups.grace_s):
                    await self._pump(lambda: not self.open_pipes)
            if not self.open_pipes:
                return
        left = await _left_in(self.pgid)
        if not left:
            return
        await self._terminate()
        with trio.move_on_after(self.groups.grace_s):
            await self._until_ended(left)

    async def _until_ended(self, left: list[int] | None) -> None:
        """Return once nothing but zombies is left in the group (``left``: what was
        found there last), reading the pipes meanwhile. Unbounded by itself: callers
        put it under the grace. Cancelled: stops waiting; no pidfd is left open."""
        try:
            while left:
                if self._watch_members(left):
                    await self._pump(lambda: not self.members)
                else:  # no pidfd here: look again after a pause
                    with trio.move_on_after(_LOOK_AGAIN_S):
                        await self._pump(lambda: not self.open_pipes)
                        await trio.sleep_forever()
                # One may have started another before it ended: look again.
                left = await _left_in(self.pgid)
        finally:
            self._forget_members()

    def _watch_members(self, pids: list[int]) -> bool:
        """Have the poller report the end of each of ``pids`` still in the group
        (through a pidfd each); ``False`` when this system has no pidfds."""
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue  # ended (and reaped) already
            except (AttributeError, OSError):
                self._forget_members()
                return False
            try:
                ours = os.getpgid(pid) == self.pgid  # not a number reused meanwhile
            except OSError:
                ours = False  # ended: reaped since the pidfd was opened
            if not ours:
                os.close(fd)
                continue
            self.members[fd] = pid
            self.poller.read(fd)
        return True

    def _member_ended(self, fd: int) -> None:
        self.poller.forget(fd)
        os.close(fd)
        del self.members[fd]

    def _forget_members(self) -> None:
        for fd in list(self.members):
            self._member_ended(fd)

    def _limit(self) -> float:
        """When the leader must be stopped, unless output comes before then."""
        limit = min(self.deadline, self.linger_until)
        if self.idle_timeout_s > 0:
            return min(limit, self.last_output + self.idle_timeout_s)
        return limit

    def _stop_bound(self) -> float:
        """How long a stop may take: the grace, the wait for a conversation to
        wind down (half the grace at most), and the pipes."""
        winding = self.groups.grace_s / 2 if self.conversation is not None else 0.0
        return self.groups.grace_s + winding + 2

    async def _stop(self) -> None:
        """SIGTERM the group, SIGKILL it after the grace (or once the leader and all
        it left have ended), and wait until it is gone.

        A conversation is first asked to wind down, and the agent given up to half
        the grace to answer and exit (ACP: the prompt returns ``cancelled``, stdin
        ends, and the agent saves its session as it leaves) while its output is
        still read. Unbounded by itself: callers put it under a deadline.
        """
        if self.conversation is not None and not self.exited and self.conversation.interrupt():
            with trio.move_on_after(self.groups.grace_s / 2):
                await self._pump(lambda: self.exited)
        await self._terminate()
        with trio.move_on_after(self.groups.grace_s):
            await self._pump(self._gone)
            # The leader is gone; what it left, told to stop with it, gets the rest
            # of the grace to end as well (an adapter's CLI saving its session).
            await self._until_ended(await _left_in(self.pgid))
        _killpg(self.pgid, signal.SIGKILL)
        await self._pump(self._gone)

    def _gone(self) -> bool:
        return self.exited and not self.open_pipes

    async def _terminate(self) -> None:
        """SIGTERM the group, and under bubblewrap every process left in the run's
        namespace outside it (``setsid``; found in ``/proc`` by a worker thread,
        abandoned when cancelled)."""
        _killpg(self.pgid, signal.SIGTERM)
        init = self.report.init() if self.report is not None else None
        if init is None:
            return
        for pid in await trio.to_thread.run_sync(namespace_leftovers, init,
                                                 abandon_on_cancel=True):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)

    def _exit_seen(self) -> None:
        """The watched process has exited: the agent, or under bubblewrap
        bubblewrap, which ends with the agent (or before it: a stop's SIGTERM)."""
        self.exited = self.proc.returncode is not None
        if self.exited:
            self.poller.forget(EXIT)

    async def _pump(self, done: Callable[[], bool]) -> None:
        """Read the pipes, feed stdin and notice the leader's exit until ``done()``.

        Cancelled: stops between two waits; nothing read is lost.
        """
        while not done():
            for fd in await self.poller.wait():
                if fd == self.stdout_fd:
                    self._read_stdout()
                elif fd == self.stderr_fd:
                    self._read_stderr()
                elif fd == EXIT:
                    self._exit_seen()
                elif fd in self.members:
                    self._member_ended(fd)
                else:
                    self._send_queued()

    def _send_queued(self) -> None:
        """Write what is queued now; have the poller report stdin while more is
        queued than fits, and end it once all is written and end-of-file is due."""
        self._feed()
        if self.unsent:
            if not self.writing and not self.stdin_closed:
                self.writing = True
                self.poller.write(self.stdin.fileno())
            return
        if self.writing:
            # Forgotten before any close: a poller must never hold a closed fd.
            self.writing = False
            self.poller.forget(self.stdin.fileno())
        if self.close_when_sent and not self.stdin_closed:
            self._end_stdin()  # end-of-file: the whole prompt is there

    def _end_stdin(self) -> None:
        self.stdin_closed = True
        self.stdin.close()

    def write(self, data: bytes) -> None:
        """:class:`StdinPipe`: queue ``data`` for the agent's stdin."""
        if self.stdin_closed or self.close_when_sent:
            return  # end-of-file was asked for: nothing more goes in
        self.unsent += data
        self._send_queued()

    def close(self, linger_s: float = LINGER_S, eof: bool = True) -> None:
        """:class:`StdinPipe`: end-of-file after what is queued; the agent then
        has ``linger_s`` to exit by itself (closed again: the sooner end holds)."""
        until = trio.current_time() + linger_s
        self.linger_until = min(self.linger_until, until) if eof else until
        if self.scope is not None:
            self.scope.deadline = min(self.scope.deadline, self.linger_until)
        if eof and not self.close_when_sent:
            self.close_when_sent = True
            self._send_queued()

    def _feed(self) -> None:
        if not self.unsent or self.stdin_closed:
            return
        try:
            sent = os.write(self.stdin.fileno(), self.unsent)
        except BlockingIOError:
            return  # the pipe is full: the agent has not read yet
        except OSError:
            sent = len(self.unsent)  # EPIPE: it exited, or closed stdin, without reading it all
        del self.unsent[:sent]

    def _heard(self) -> None:
        self.last_output = trio.current_time()
        if self.output is not None:
            self.output.heard(self.last_output)

    def _read(self, fd: int) -> bytes | None:
        """What the pipe ``fd`` has (``b""`` at end-of-file, then no longer watched),
        or ``None`` when it had nothing after all."""
        try:
            chunk = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise trio.BrokenResourceError(f"reading the agent's output failed: {exc}") from exc
        if chunk:
            self._heard()
        else:
            self.poller.forget(fd)
            self.open_pipes -= 1
            self.ended.add(fd)
        return chunk

    def _read_ready(self) -> None:
        """Read what the open pipes hold now, their end-of-file included, without
        waiting (bubblewrap's end is often seen before its init's)."""
        if self.stdout_fd not in self.ended:
            self._read_stdout()
        if self.stderr_fd not in self.ended:
            self._read_stderr()

    def _read_stdout(self) -> None:
        chunk = self._read(self.stdout_fd)
        if not chunk:
            return
        room = self.max_stdout_bytes - len(self.stdout)
        if len(chunk) > room:
            self.stdout_truncated = True
        if room > 0:
            self.stdout += chunk[:room]
        if self.lines is not None:
            self.lines.feed(chunk)

    def _read_stderr(self) -> None:
        chunk = self._read(self.stderr_fd)
        if chunk:
            self.stderr.feed(chunk)


@contextlib.asynccontextmanager
async def start_agent(
    launch: Launch,
    groups: ProcessGroups,
    limits: ProcessLimits = DEFAULT_LIMITS,
    output: Output | None = None,
) -> AsyncIterator[AgentWatch]:
    """Spawn ``launch.command`` through ``/bin/sh -c`` as a new process group, and
    yield its :class:`AgentWatch` as soon as the process exists (its ``pgid`` is the
    group's); :meth:`AgentWatch.finish` then watches it end.

    With a ``launch.confinement`` (docs/protocol.md §13), the shell starts confined, and so
    does everything it starts: its ``argv_prefix`` goes before ``/bin/sh``, and on
    Linux the spawn is made from a thread in its domain. The caller closes it (it
    may spawn again with it).

    The process runs in ``launch.cwd`` with exactly ``launch.env``, gets
    ``launch.stdin_text`` (UTF-8) on stdin and then end-of-file, and is stopped (SIGTERM
    to the group, SIGKILL ``groups.grace_s`` later) when ``limits.deadline`` (on trio's
    clock) passes or when neither stream has printed anything for
    ``limits.idle_timeout_s`` (0 = no idle limit).
    Whichever way the leader exits, its group is then swept with SIGKILL, and
    ``finish`` returns only once the pipes say every process that held them has
    exited (bounded: a process that left the group can only delay it a little).

    Between the spawn and ``finish`` (the caller makes the group durable there) the
    agent's output is not read, the pipes buffering it; a limit that passed
    meanwhile stops the group as ``finish`` begins. What the agent prints goes to
    ``output`` as it is read; ``leader_exited`` is set once the leader has exited,
    whatever ended it but a cancellation, before the group's rest is given the grace
    (the caller then knows the agent finished, though ``finish`` has not returned).

    With a ``launch.conversation``, ``stdin_text`` is not written: the conversation
    talks with the agent over stdin (see :class:`~prohost.engine.agent.launch.Conversation`),
    is asked to wind it down before any stop, and says when stdin ends; the agent then
    has ``LINGER_S`` to exit, after which its group is stopped (not a timeout).

    Raises ``OSError`` when the process cannot be started (missing ``cwd``, …).

    Left by an exception or a cancellation (the caller's step after the spawn
    failed, or ``finish`` was cancelled): the group is stopped the same way (SIGTERM,
    SIGKILL after the grace; with a conversation, first its wind-down, up to half the
    grace) inside a shielded scope bounded at ``groups.grace_s + 2`` seconds (plus the
    wind-down), then the exception is re-raised (a cancellation as a plain
    ``trio.Cancelled``, not a group). However it is left, the group is SIGKILLed and
    out of ``groups`` by then.
    """
    command, cwd, env = launch.command, launch.cwd, launch.env
    confinement, conversation = launch.confinement, launch.conversation
    proc: trio.Process | Spawned
    report = Report() if confinement is not None and confinement.namespaced else None
    try:
        if confinement is not None and confinement.has_domain:
            proc = await spawn_confined(confinement, command, cwd=cwd, env=env, report=report)
        else:
            if confinement is not None:
                confinement.rewind()
            proc = await trio.lowlevel.open_process(
                command_line(confinement, command, cwd, report),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
                pass_fds=(*confinement.pass_fds, *((report.told,) if report else ()))
                if confinement is not None else (),
            )
    except BaseException:
        if report is not None:
            report.close()
        raise
    if report is not None:
        report.spawned()
    # start_new_session makes the child a session and group leader: pgid == pid.
    pgid = proc.pid
    groups.add(pgid)
    try:
        watch = AgentWatch(
            proc,
            stdin_data=b"" if conversation is not None else launch.stdin_text.encode("utf-8"),
            groups=groups,
            deadline=limits.deadline,
            idle_timeout_s=limits.idle_timeout_s,
            max_stdout_bytes=limits.max_stdout_bytes,
            max_line_bytes=limits.max_line_bytes,
            output=output,
            conversation=conversation,
            report=report,
        )
        try:
            watch._begin()
            try:
                yield watch
            except BaseException:
                # The pipes are still drained while the group stops, both so an agent
                # blocked on a full pipe can die and so end-of-file can say it is gone.
                with trio.move_on_after(watch._stop_bound(), shield=True):
                    await watch._stop()
                raise
        finally:
            watch.poller.close()
    finally:
        # Whatever happened above, nothing of this group may outlive the call.
        _killpg(pgid, signal.SIGKILL)
        groups.discard(pgid)
        if report is not None:
            report.close()
        # Plain closes: each aclose() would be one more trip through the scheduler.
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if isinstance(stream, trio.lowlevel.FdStream):
                stream.close()


def _pipe(stream: object, name: str) -> trio.lowlevel.FdStream:
    """The child's ``name`` pipe; every agent is spawned with all three piped."""
    if not isinstance(stream, trio.lowlevel.FdStream):
        raise RuntimeError(f"the agent process has no {name} pipe; it must be spawned with PIPE")
    return stream
