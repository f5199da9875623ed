"""A run's places, as the confinement grants them (docs/protocol.md §13).

One job: say which paths a run's agent may write, read or not see at all, and
have the OS library (:mod:`prohost.engine.sandbox`) make that a confinement its
process tree gets at spawn. How the rules are enforced is the library's; what
they are is here, in one place, so that ``docs/security.md`` can say exactly
what a run is granted.

A confined run **may write** (each also readable):

- its working directory: ``--workdir`` without ``--repos``; with ``--repos``, its
  conversation's worktrees instead (``--workdir`` is then no run's place);
- for each worktree, what git needs to commit there, in the conversation's own
  repository (:mod:`prohost.engine.repos.lanerepo`; its common dir below): the
  worktree's private git dir (``<common>/worktrees/<name>``: its ``HEAD``, index,
  logs), its objects (``<common>/objects``; the person's store is a read-only
  alternate), and the folders of its branches, ``<common>/refs/heads/prohost``
  and ``<common>/logs/refs/heads/prohost`` (not the one ref file: git writes
  ``<ref>.lock`` beside it and renames it over it). All from the harness's
  records (:func:`git_places`), never the worktree's ``.git``. Nothing of the
  person's repository (a worktree made by an earlier version is of the
  person's repository, and gets these places there until it is collected);
- its scratch folder (``$PROHOST_HOME/runs/<digest>``: the MCP configuration and
  a private ``TMPDIR``, both removed after the run);
- the agent CLI's own folder for the run's account: ``CLAUDE_CONFIG_DIR`` (else
  ``~/.claude`` and the file ``~/.claude.json``, which Claude Code writes in place
  when it cannot make its temporary file beside it), ``CODEX_HOME`` (else
  ``~/.codex``);
- the usual per-user caches and the device files (the library's lists);
- each ``--allow-write``.

It **may read** everything else but what is hidden: ``$PROHOST_HOME`` (its own
places inside are granted above; the lane folder holding its worktrees is
readable, so ``ls $PROHOST_RUN_REPOS`` works) and the usual secrets, unless an
``--allow-read`` names one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from prohost.engine.agent.environment import make_private_folder
from prohost.engine.blocking import FILE_STEP_TIMEOUT_S, Bounds, StepTimedOut, wake_from_thread
from prohost.engine.repos.gitcmd import GitPlaces
from prohost.engine.repos.gitrecords import no_link_below
from prohost.engine.sandbox import Confinement, Policy, RuleCache, Support, defaults, prepare, probe
from prohost.options import Options

log = logging.getLogger("prohost.confine")

#: The run's private temporary folder, inside its scratch folder.
TMP_NAME = "tmp"
#: The folder (under ``refs/heads`` and ``logs/refs/heads``) of the branches the
#: harness gives conversations' worktrees (``prohost/<lane folder>``).
BRANCH_FOLDER = "prohost"


class ConfinementFailed(Exception):
    """A run's confinement could not be made: the agent is not started (never
    unconfined by accident). The message says why, naming no local path."""


@attrs.frozen
class Sandbox:
    """How this harness confines its agents, decided once at start."""

    #: --sandbox: auto, required or off.
    mode: str
    #: What the system can do (``None``: not asked, ``--sandbox off``).
    support: Support | None
    allow_write: tuple[Path, ...] = ()
    allow_read: tuple[Path, ...] = ()
    #: ``$PROHOST_HOME``: hidden from every run.
    home: Path = Path("/nonexistent")
    #: ``$HOME`` as the harness sees it: where ``~`` of the secrets and caches is.
    user_home: Path = Path("/nonexistent")

    @classmethod
    def start(cls, options: Options, env: Mapping[str, str]) -> Sandbox:
        """The harness's sandbox for ``options``: the system asked unless ``off``.
        Never refuses: ``required`` is checked by the command line before (exit 2)."""
        support = None if options.sandbox == "off" else probe()
        if support is not None and support.kind == "landlock":
            # What runs' rules have in common, kept for the harness's lifetime
            # (issue 29); closed by close() at its exit.
            support = attrs.evolve(support, rules=RuleCache())
        home = env.get("HOME")
        return cls(mode=options.sandbox, support=support, allow_write=options.allow_write,
                   allow_read=options.allow_read, home=options.home,
                   user_home=Path(home) if home else Path.home())

    def close(self) -> None:
        """Close what the support's rule cache holds (the harness's exit; never waits)."""
        if self.support is not None and self.support.rules is not None:
            self.support.rules.close()

    @property
    def confines(self) -> bool:
        """Runs are confined: not ``off``, and the system can."""
        return self.support is not None and self.support.kind is not None

    def describe(self) -> str:
        """``confined (Landlock ABI 7)`` or ``NOT confined: <reason>``, as the
        panel, ``agent status`` and the log say it."""
        if self.support is None:
            return "NOT confined: --sandbox off"
        if self.support.kind is None:
            return f"NOT confined: {self.support.reason}"
        return f"confined ({self.support.detail})"


#: A sandbox that confines nothing (``--sandbox off``): the runner's when given none.
SANDBOX_OFF = Sandbox(mode="off", support=None)


@attrs.frozen
class RunPlaces:
    """What a run's places are made of, known before its attempt."""

    #: The working directory (without --repos); ``None`` with --repos.
    workdir: Path | None
    #: The conversation's worktrees (with --repos).
    worktrees: tuple[Path, ...]
    #: The folder holding them (readable, for ``PROHOST_RUN_REPOS``).
    lane_folder: Path | None
    #: The run's scratch folder (MCP configuration, TMPDIR).
    scratch: Path
    #: Whose own folders are granted: the brain's name (claude, codex, plain), or
    #: for the ACP brain the agent its command starts (gemini, claude, …; ``acp``
    #: when it is none of the known ones: nothing of its own is granted then).
    brain: str
    #: The attempt's environment (its account's CLAUDE_CONFIG_DIR / CODEX_HOME).
    env: Mapping[str, str]
    #: Each worktree's git places, from the harness's records (what git needs to
    #: commit there is granted from these, never from a worktree's ``.git``).
    git: tuple[GitPlaces, ...] = ()


def git_places(places: GitPlaces) -> list[Path]:
    """What git needs to commit in a worktree: its private git dir, the shared
    object store, and the harness's branch folders (made when missing: a rule is
    made on a path that exists, and ``git pack-refs`` removes empty ones).

    Made from the harness's records (``places``, kept in the lane marker since the
    worktree was made), never from the worktree's ``.git`` file or its git dir's
    ``commondir``, which a run could have rewritten (§13); and refused
    (``OSError``) when a part of one below the common dir is a symbolic link.
    Blocking."""
    common = Path(places.common_dir)
    branches = [common / "refs" / "heads" / BRANCH_FOLDER,
                common / "logs" / "refs" / "heads" / BRANCH_FOLDER]
    for folder in branches:
        folder.mkdir(parents=True, exist_ok=True)
    granted = [Path(places.git_dir), common / "objects", *branches]
    for path in granted:
        no_link_below(places.common_dir, str(path))
    return granted


def agent_folders(brain: str, env: Mapping[str, str], user_home: Path) -> list[Path]:
    """The agent CLI's own folder (and file) for the account in ``env``. A CLI's
    folder is made when missing (the CLI would make it; a rule needs it to exist);
    a plain agent gets those of either CLI that exist (all are named: the library
    grants only what exists); an ACP agent (``brain`` is then
    the agent, :func:`prohost.execline.acp_agent`) those of
    :data:`~prohost.engine.sandbox.defaults.AGENT_FOLDERS`, or Claude's or Codex's
    for their adapters. Blocking."""
    folders: list[Path] = []
    files: list[Path] = []
    if brain in defaults.AGENT_FOLDERS:
        folders = [user_home / folder for folder in defaults.AGENT_FOLDERS[brain]]
        for folder in folders:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return folders
    if brain in ("claude", "plain"):
        configured = env.get("CLAUDE_CONFIG_DIR")
        if configured:
            folders.append(Path(configured))
        else:
            folders.append(user_home / ".claude")
            # Claude Code writes it through a temporary file beside it and falls back
            # to writing it in place when that is refused: the file alone is enough.
            # Named whether or not it exists (the library grants only what does):
            # the policy depends on the run alone, so one made ahead stays the
            # run's (prohost.engine.run.spares).
            files.append(user_home / ".claude.json")
    if brain in ("codex", "plain"):
        configured = env.get("CODEX_HOME")
        folders.append(Path(configured) if configured else user_home / ".codex")
    if brain == "plain":
        return [*folders, *files]  # those that exist are granted (see above)
    for folder in folders:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return [*folders, *files]


def policy_for(sandbox: Sandbox, places: RunPlaces) -> Policy:
    """The run's policy (see the module docstring). Blocking: it makes the
    folders a rule needs."""
    writable: list[Path] = []
    readable: list[Path] = list(sandbox.allow_read)
    if places.worktrees:
        writable += places.worktrees
        for git in places.git:
            writable += git_places(git)
        if places.lane_folder is not None:
            readable.append(places.lane_folder)
    elif places.workdir is not None:
        writable.append(places.workdir)
    writable.append(places.scratch)
    writable += agent_folders(places.brain, places.env, sandbox.user_home)
    home = sandbox.user_home
    # One that does not exist gets no grant (the library drops it).
    writable += [home / cache for cache in defaults.CACHES]
    writable += [Path(device) for device in defaults.DEVICES]
    writable += sandbox.allow_write
    hidden = [sandbox.home, *(home / secret for secret in defaults.SECRETS)]
    return Policy(writable=tuple(writable), readable=tuple(readable), hidden=tuple(hidden))


@attrs.define
class RunConfinement:
    """A prepared confinement and the private ``TMPDIR`` it grants."""

    confinement: Confinement
    tmpdir: Path

    def close(self) -> None:
        self.confinement.close()


class Making:
    """One confinement being made in a worker thread that may be abandoned: one
    finished after its caller gave up is closed there, never leaked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self.made: RunConfinement | None = None

    def make(self, sandbox: Sandbox, support: Support, places: RunPlaces, *,
             spawner: bool = True) -> RunConfinement:
        """The run's confinement, made now; with ``spawner``, the thread its spawn
        will be made from is started too (the run is about to spawn; one made
        ahead, :mod:`prohost.engine.run.spares`, has its own started when kept).
        Blocking."""
        tmpdir = places.scratch / TMP_NAME
        make_private_folder(tmpdir)
        if places.workdir is not None:
            # A grant needs the folder (one that does not exist gets none): made here
            # too, since an early confinement is made before the runner makes it,
            # and one removed between runs is made again.
            places.workdir.mkdir(parents=True, exist_ok=True)
        confinement = prepare(policy_for(sandbox, places), support)
        if spawner:
            confinement.ready_spawner()
        with self._lock:
            if self._abandoned:
                confinement.close()
                raise ConfinementFailed("abandoned")
            self.made = RunConfinement(confinement, tmpdir)
            return self.made

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            if self.made is not None:
                self.made.close()
                self.made = None


async def confine(sandbox: Sandbox, places: RunPlaces, deadline: float,
                  bounds: Bounds) -> RunConfinement | None:
    """The run's confinement, prepared in a worker thread within ``deadline`` (trio
    time) and the file steps' bound; ``None`` when runs are not confined. Raises
    :class:`ConfinementFailed` when it cannot be made: the agent must not start.

    Cancelled: the worker thread is abandoned (the shielded bound of
    :meth:`Bounds.file_step`); what it makes after that is closed by it, and its
    ``TMPDIR`` is removed with the scratch folder.
    """
    support = sandbox.support
    if support is None or support.kind is None:
        return None
    making = Making()
    limit_s = max(0.0, min(FILE_STEP_TIMEOUT_S, deadline - trio.current_time()))
    try:
        return await bounds.file_step(making.make, sandbox, support, places,
                                      what="confining the agent", limit_s=limit_s)
    except ConfinementFailed:
        making.abandon()
        raise
    except Exception as exc:
        making.abandon()
        raise _failure(exc) from None
    except BaseException:
        making.abandon()
        raise


def _failure(exc: Exception) -> ConfinementFailed:
    """Why a confinement could not be made, as the run's error says it: logged with
    its paths here, while the server hears no local path (§7)."""
    log.warning("could not confine the agent: %s", exc)
    if isinstance(exc, StepTimedOut):
        return ConfinementFailed("preparing it did not finish in time")
    if isinstance(exc, OSError):
        return ConfinementFailed(exc.strerror or type(exc).__name__)
    return ConfinementFailed(type(exc).__name__)


class EarlyConfinement:
    """A run's confinement begun before the steps that come ahead of its spawn (its
    ``started`` fsync, its prompt), so that making it costs the run no time when
    its places are known from the start (no ``--repos``). Taken by the attempt
    (:meth:`take`), or thrown away (:meth:`discard`); one made after either is
    closed where it was made, never leaked.

    With one made ahead (:mod:`prohost.engine.run.spares`), its watch says at once
    whether it is still right, or else its own readied thread checks (no thread is
    started for the run either way); when it is not, it is closed and one is made
    anew, in the same scratch folder."""

    def __init__(self, sandbox: Sandbox, places: RunPlaces,
                 ahead: RunConfinement | None = None) -> None:
        """Begin it for ``places``; with ``ahead`` (made before for the same places,
        its scratch folder theirs), only check that one is still right."""
        support = sandbox.support
        assert support is not None and support.kind is not None
        self.places = places
        self.taken = False
        self._sandbox, self._support = sandbox, support
        self._making = Making()
        self._done = trio.Event()
        #: The making thread's ``outcome.Outcome`` (trio's own type), once delivered.
        self._result: Any = None
        #: The readied thread's answer for ``ahead``: (still right, what it raised).
        self._checked: tuple[object, BaseException | None] | None = None
        self._ahead: RunConfinement | None = None
        self._began = trio.current_time()
        self._token = trio.lowlevel.current_trio_token()
        if ahead is not None:
            unchanged = ahead.confinement.unchanged()
            if unchanged is not None:
                # Its watch answers at once, and no thread is needed at all.
                self._ahead, self._checked = ahead, (unchanged, None)
                self._done.set()
                return
            if ahead.confinement.check_soon(self._deliver_check):
                self._ahead = ahead
                return
            ahead.close()  # neither can tell: made anew, in its scratch folder
        self._make()

    def _deliver_check(self, right: object, error: BaseException | None) -> None:
        self._checked = (right, error)
        wake_from_thread(self._token, self._done.set)

    def _make(self) -> None:
        token, done = self._token, self._done
        sandbox, support, places, making = self._sandbox, self._support, self.places, self._making

        def deliver(result: Any) -> None:
            self._result = result
            wake_from_thread(token, done.set)

        # A thread of trio's cache, as to_thread's are; its result comes back
        # through deliver (in that thread), which wakes :meth:`take`.
        trio.lowlevel.start_thread_soon(
            lambda: making.make(sandbox, support, places), deliver)

    async def take(self, deadline: float) -> RunConfinement:
        """The confinement, once made: by ``deadline`` (trio time) and within the
        file steps' bound from when it began; raises :class:`ConfinementFailed`.

        Cancelled: it is abandoned (closed when its thread finishes).
        """
        self.taken = True
        with trio.move_on_at(min(deadline, self._began + FILE_STEP_TIMEOUT_S)):
            try:
                await self._done.wait()
                ahead = self._ahead
                if ahead is not None and self._checked is not None:
                    right, error = self._checked
                    if right is True and error is None:
                        log.debug("confined with the rules made ahead")
                        return ahead
                    self._ahead = None
                    ahead.close()
                    log.debug("the rules made ahead were out of date: made anew")
                    self._done = trio.Event()
                    self._make()
                    await self._done.wait()
            except BaseException:
                self.discard(taken=True)
                raise
        if self._result is None:
            self.discard(taken=True)
            raise _failure(StepTimedOut("preparing it took too long")) from None
        try:
            made: RunConfinement = self._result.unwrap()
            return made
        except ConfinementFailed:
            raise
        except Exception as exc:
            raise _failure(exc) from None

    def discard(self, *, taken: bool = False) -> None:
        """Not taken after all (the run ended before its attempt; or ``taken``, its
        taking failed): close it, now or when its thread finishes."""
        if self.taken and not taken:
            return
        if self._ahead is not None:
            self._ahead.close()  # joins its thread: a check it has begun ends first
            self._ahead = None
        self._making.abandon()


def confined_env(env: Mapping[str, str], confined: RunConfinement | None) -> dict[str, str]:
    """``env`` with the run's private ``TMPDIR`` when it is confined (``/tmp`` is
    read-only to it then)."""
    result = dict(env)
    if confined is not None:
        result["TMPDIR"] = str(confined.tmpdir)
    return result

