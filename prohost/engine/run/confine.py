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

import attrs
import trio

from prohost.engine.agent.environment import make_private_folder
from prohost.engine.blocking import FILE_STEP_TIMEOUT_S, Bounds, StepTimedOut
from prohost.engine.repos.gitcmd import GitPlaces
from prohost.engine.repos.gitrecords import no_link_below
from prohost.engine.sandbox import Confinement, Policy, Support, defaults, prepare, probe
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
        home = env.get("HOME")
        return cls(mode=options.sandbox, support=support, allow_write=options.allow_write,
                   allow_read=options.allow_read, home=options.home,
                   user_home=Path(home) if home else Path.home())

    def close(self) -> None:
        """Nothing is kept between runs: here for the harness's exit."""

    @property
    def confines(self) -> bool:
        """Runs are confined: not ``off``, and the system can."""
        return self.support is not None and self.support.kind is not None

    @property
    def complete(self) -> bool:
        """Every point of §13 holds for a run (its completion says confined)."""
        return self.support is not None and self.support.complete

    def describe(self) -> str:
        """``confined (bubblewrap, Landlock ABI 7)``, ``partly confined (…): not
        covered: …`` or ``NOT confined: <reason>``, as the panel, ``agent status``
        and the log say it."""
        if self.support is None:
            return "NOT confined: --sandbox off"
        if self.support.kind is None:
            return f"NOT confined: {self.support.reason}"
        if self.support.gaps:
            why = f"; {self.support.reason}" if self.support.reason else ""
            return (f"partly confined ({self.support.detail}{why}): not covered: "
                    + "; ".join(self.support.gaps))
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


def make(sandbox: Sandbox, support: Support, places: RunPlaces) -> RunConfinement:
    """The attempt's confinement, made now, anew (nothing is kept between attempts:
    what a run changed cannot carry a grant into the next). Blocking."""
    tmpdir = places.scratch / TMP_NAME
    make_private_folder(tmpdir)
    if places.workdir is not None:
        # A grant needs the folder (one that does not exist gets none), and one
        # removed between runs is made again.
        places.workdir.mkdir(parents=True, exist_ok=True)
    return RunConfinement(prepare(policy_for(sandbox, places), support, tmpdir=tmpdir), tmpdir)


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
    made: list[RunConfinement] = []
    abandoned = threading.Event()
    lock = threading.Lock()

    def making() -> RunConfinement:
        confined = make(sandbox, support, places)
        with lock:
            if abandoned.is_set():
                confined.close()  # its caller gave up: never leaked
                raise ConfinementFailed("abandoned")
            made.append(confined)
        return confined

    limit_s = max(0.0, min(FILE_STEP_TIMEOUT_S, deadline - trio.current_time()))
    try:
        return await bounds.file_step(making, what="confining the agent", limit_s=limit_s)
    except BaseException as exc:
        with lock:
            abandoned.set()
            for confined in made:
                confined.close()
        if isinstance(exc, Exception) and not isinstance(exc, ConfinementFailed):
            raise _failure(exc) from None
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


#: Variables that name a socket of the person's (an agent, a terminal multiplexer,
#: a session bus): not passed to a confined run (§13), which could not reach the
#: socket anyway, unless ``--allow-write`` names the socket.
SOCKET_VARIABLES = ("SSH_AUTH_SOCK", "GPG_AGENT_INFO", "TMUX", "TMUX_PANE", "STY",
                    "DBUS_SESSION_BUS_ADDRESS", "WAYLAND_DISPLAY", "DOCKER_HOST")


def confined_env(env: Mapping[str, str], confined: RunConfinement | None,
                 allow_write: tuple[Path, ...] = ()) -> dict[str, str]:
    """``env`` with the run's private ``TMPDIR`` when it is confined, and without
    the variables that name the person's sockets (:data:`SOCKET_VARIABLES`) unless
    an ``--allow-write`` names the socket."""
    result = dict(env)
    if confined is not None:
        result["TMPDIR"] = str(confined.tmpdir)
        allowed = {str(path) for path in allow_write}
        for name in SOCKET_VARIABLES:
            value = result.get(name)
            if value is not None and value.split(",")[0] not in allowed:
                del result[name]
    return result

