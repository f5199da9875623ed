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
- the agent CLI's own folder for the run's account, the harness's own for the
  default account (``$PROHOST_HOME/cli/default/<cli>``, named by
  ``CLAUDE_CONFIG_DIR`` or ``CODEX_HOME``); an ACP agent's folders, the
  harness's (``$PROHOST_HOME/agents/<agent>/…``, seen where the agent looks for
  them through ``Policy.mounts``); never the person's ``~/.claude`` or
  ``~/.codex``; the plain brain gets none;
- the harness's cache folder (``$PROHOST_HOME/cache``; :func:`confined_env`
  points the tools at it), never the person's ``~/.cache``; the device files;
- each ``--allow-write``.

It **may read** everything else but what is hidden: ``$PROHOST_HOME`` (its own
places inside are granted above; the lane folder holding its worktrees is
readable, so ``ls $PROHOST_RUN_REPOS`` works) and the usual secrets, unless an
``--allow-read`` names one.

No grant the harness chooses passes through a symbolic link below a place a run
may write (:func:`refuse_planted_links`), and a grant that would uncover a hidden
place is refused at start (:func:`grant_problems`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

import attrs
import trio

from prohost.engine.agent.environment import make_private_folder, without_sockets
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


#: The harness's own folders for ACP agents (:data:`defaults.AGENT_FOLDERS`) and
#: for runs' caches (:data:`defaults.CACHE_VARIABLES`), under ``$PROHOST_HOME``.
AGENTS_FOLDER = "agents"
CACHE_FOLDER = "cache"


def agent_folders(brain: str, env: Mapping[str, str], user_home: Path,
                  home: Path) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """What the agent CLI may write of its own: (folders, mounts). Claude's and
    Codex's (also for their ACP adapters) are the account's folder its variable
    names (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``: the default account's is the
    harness's own, :mod:`prohost.engine.accounts.logins`), made when missing; an
    ACP agent of :data:`~prohost.engine.sandbox.defaults.AGENT_FOLDERS` gets
    folders of the harness's under ``home`` (``$PROHOST_HOME``), each bound where the
    agent looks for its own under ``user_home``; the plain brain gets none, and
    nothing is ever the person's own folder (§13). Blocking."""
    if brain in defaults.AGENT_FOLDERS:
        owned = home / AGENTS_FOLDER / brain
        mounts = [(owned / folder, user_home / folder) for folder in defaults.AGENT_FOLDERS[brain]]
        for source, seen in mounts:
            source.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Where the agent looks must exist for bubblewrap to bind the source
            # there (the home is read-only in the run's view): made empty, as the
            # agent itself would make it; the person's own folder is never granted.
            seen.mkdir(mode=0o700, parents=True, exist_ok=True)
        return [source for source, _seen in mounts], mounts
    variable = {"claude": "CLAUDE_CONFIG_DIR", "codex": "CODEX_HOME"}.get(brain)
    configured = env.get(variable, "").strip() if variable else ""
    if not configured:
        return [], []
    folder = Path(configured)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return [folder], []


def cache_folders(home: Path) -> Path:
    """The harness's cache folder for runs' tools (made, with each tool's folder)."""
    root = home / CACHE_FOLDER
    for name in (*defaults.CACHE_VARIABLES.values(), defaults.MAVEN_REPOSITORY):
        (root / name).mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


class PlantedLink(ConfinementFailed):
    """A grant would pass through a symbolic link in a place a run may write."""


def refuse_planted_links(grants: list[Path], roots: list[Path]) -> None:
    """Raise :class:`PlantedLink` when a component of a grant, below one of ``roots``
    (places a run may write, and ``$PROHOST_HOME``), is a symbolic link: a run could
    have planted it there to widen a later run's grant (issue 36, attack 3). Looked
    at with lstat, never followed. Blocking."""
    for grant in grants:
        for root in roots:
            if grant == root or root not in grant.parents:
                continue
            component = root
            for name in grant.relative_to(root).parts:
                component = component / name
                try:
                    linked = component.is_symlink()
                except OSError:
                    linked = False
                if linked:
                    log.warning("refusing to confine a run through %s: it is a symbolic "
                                "link inside %s, where a run may write; remove it", component,
                                root)
                    raise PlantedLink(
                        "one of its places would pass through a symbolic link where a run "
                        "may write (named in the harness's log): remove that link")


def policy_for(sandbox: Sandbox, places: RunPlaces) -> Policy:
    """The run's policy (see the module docstring). Blocking: it makes the
    folders a rule needs. Raises :class:`PlantedLink` when a grant would pass
    through a link a run could plant."""
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
    own, mounts = agent_folders(places.brain, places.env, sandbox.user_home, sandbox.home)
    # The places the harness chooses (the person's --workdir and --allow-write are
    # theirs, links and all): none passes through a link a run could have planted.
    chosen = [places.scratch, *own, cache_folders(sandbox.home)]
    refuse_planted_links(chosen, [sandbox.home, *writable, *chosen, *sandbox.allow_write])
    writable += chosen
    writable += [Path(device) for device in defaults.DEVICES]
    writable += sandbox.allow_write
    home = sandbox.user_home
    hidden = [sandbox.home, *(home / secret for secret in defaults.SECRETS)]
    return Policy(writable=tuple(writable), readable=tuple(readable), hidden=tuple(hidden),
                  mounts=tuple(mounts))


@attrs.define
class RunConfinement:
    """A prepared confinement and the private ``TMPDIR`` it grants."""

    confinement: Confinement
    tmpdir: Path
    #: The harness's cache folder the run's tools are pointed at.
    caches: Path | None = None

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
    return RunConfinement(prepare(policy_for(sandbox, places), support, tmpdir=tmpdir), tmpdir,
                          sandbox.home / CACHE_FOLDER)


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


def confined_env(env: Mapping[str, str], confined: RunConfinement | None,
                 allow_write: tuple[Path, ...] = ()) -> dict[str, str]:
    """``env`` as a confined run gets it: its private ``TMPDIR`` (``/tmp`` is
    read-only to it), its tools pointed at the harness's caches, and no variable
    naming one of the person's sockets unless ``--allow-write`` names the socket
    (§13; :data:`~prohost.engine.agent.environment.SOCKET_VARIABLES`). Unchanged
    when it is not confined."""
    if confined is None:
        return dict(env)
    result = without_sockets(env, allow_write)
    result["TMPDIR"] = str(confined.tmpdir)
    if confined.caches is not None:
        result.update(cache_variables(confined.caches, env))
    return result


def cache_variables(root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The variables that point a run's tools at the harness's caches under
    ``root`` (:data:`~prohost.engine.sandbox.defaults.CACHE_VARIABLES`), with Maven's
    local repository added to ``env``'s ``MAVEN_OPTS``."""
    result = {name: str(root / folder) for name, folder in defaults.CACHE_VARIABLES.items()}
    maven = f"-Dmaven.repo.local={root / defaults.MAVEN_REPOSITORY}"
    before = env.get("MAVEN_OPTS", "").strip()
    result["MAVEN_OPTS"] = f"{before} {maven}" if before else maven
    return result


def grant_problems(options: Options, user_home: Path) -> list[str]:
    """Why ``options`` would grant runs a place that holds what they must not see
    (§13: ``--workdir ~``, an ``--allow-write`` of a folder holding
    ``$PROHOST_HOME`` or a secret store), one line each with what to do; empty when
    none would, or with ``--sandbox off`` (nothing is confined then). Refused at
    start, exit 2: a grant is a whole hierarchy, and a hidden place inside one
    cannot be hidden, so the harness would say confined while it is not.
    ``user_home``: ``$HOME`` as the harness sees it. Blocking (resolves paths)."""
    if options.sandbox == "off":
        return []
    home = user_home.resolve()
    hidden = [(options.home.resolve(), "$PROHOST_HOME"),
              *((home / secret, f"~/{secret}") for secret in defaults.SECRETS)]
    named = [("--allow-write", path) for path in options.allow_write]
    if not options.repos:  # with --repos, --workdir is no run's place
        named.insert(0, ("--workdir", options.workdir))
    problems = []
    for flag, path in named:
        real = path.resolve()
        if flag == "--workdir" and real == home:
            problems.append(
                f"--workdir {path} is your home folder: every run could write all of it, "
                "your dotfiles and the secret stores in it (~/.ssh, …) included; name a "
                "folder for the agents' work, such as ~/agent-work")
            continue
        held = [name for place, name in hidden if real == place or real in place.parents]
        if held:
            problems.append(
                f"{flag} {path} holds {', '.join(held[:3])}"
                f"{' and more' if len(held) > 3 else ''}, which runs must not see or "
                f"change; name a folder inside it that holds none of them")
    # Runs write their account's folder (settings, hooks): never the one the
    # person's own sessions use.
    own = {home / ".claude", home / ".codex",
           *(home / folder for folders in defaults.AGENT_FOLDERS.values() for folder in folders)}
    for name, folder in options.accounts:
        real = folder.resolve()
        if real in own or real == home or any(
                real == place or real in place.parents for place, _ in hidden):
            problems.append(
                f"--account {name}={folder} is a folder your own sessions use (or holds "
                "what runs must not see): runs on that account would write its settings "
                f"and hooks; log the account into a folder of its own (e.g. "
                f"CLAUDE_CONFIG_DIR=~/.claude-{name} claude), or leave --account out to "
                "use your login through the harness's own folder")
    return problems
