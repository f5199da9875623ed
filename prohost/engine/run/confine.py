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
- its scratch folder (``$PROHOST_HOME/runs/<digest>``: the MCP configuration
  and, under Landlock or Seatbelt, a private ``TMPDIR``, both removed after the
  run); under bubblewrap its ``TMPDIR`` is its namespace's own empty ``/tmp``
  (:data:`NAMESPACE_TMP`), gone with it;
- the agent CLI's own folder for the run's account and conversation, the
  harness's (``$PROHOST_HOME/cli/<account>/lanes/<lane folder>/<cli>``, named by
  ``CLAUDE_CONFIG_DIR`` or ``CODEX_HOME``), and Claude Code's login store the
  account's conversations share (``CLAUDE_SECURESTORAGE_CONFIG_DIR``:
  :mod:`prohost.engine.accounts.logins`); an ACP agent's folders, the
  harness's (``$PROHOST_HOME/agents/<agent>/…``): the upper folders of overlays
  of the person's own where the agent looks for them (``Policy.overlays``: the
  person's settings and login are seen, the writes are the harness's), or bound
  there where the person has none (``Policy.mounts``); never the person's
  ``~/.claude`` or ``~/.codex``; the plain brain gets none (which folders, and
  how they are shown: :mod:`prohost.engine.run.agentfolders`);
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

import contextlib
import logging
import os
import shutil
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

import attrs
import trio

from prohost.engine.accounts.logins import FOLDER_VARIABLES
from prohost.engine.agent.environment import (
    SOCKET_VARIABLES,
    make_private_folder,
    socket_path,
    without_sockets,
)
from prohost.engine.blocking import FILE_STEP_TIMEOUT_S, Bounds, StepTimedOut
from prohost.engine.repos.gitcmd import GitPlaces
from prohost.engine.repos.gitrecords import no_link_below
from prohost.engine.run.agentfolders import (
    AGENTS_FOLDER,
    agent_folders,
    new_work_folder,
    overlays_mount,
    remove_work_folders,
)
from prohost.engine.sandbox import (
    Confinement,
    ConfinementFailed,
    Policy,
    Support,
    defaults,
    prepare,
    probe,
    seccomp,
)
from prohost.engine.sandbox.probe import SOCKET_GRANT_GAP
from prohost.execline import program_index, split_command
from prohost.options import Options

log = logging.getLogger("prohost.confine")

#: The run's private temporary folder, inside its scratch folder (Landlock,
#: Seatbelt: a folder the harness makes and removes).
TMP_NAME = "tmp"
#: Under bubblewrap, the run's private temporary folder: its namespace's own empty
#: tmpfs at ``/tmp``, gone with the namespace. Nothing on the disk is made for it or
#: removed after it (the two were most of a plain run's scratch work: two ``mkdir``,
#: two ``rmdir`` and a worker thread's trip, docs/benchmarks.md).
NAMESPACE_TMP = Path("/tmp")
#: The folder (under ``refs/heads`` and ``logs/refs/heads``) of the branches the
#: harness gives conversations' worktrees (``prohost/<lane folder>``).
BRANCH_FOLDER = "prohost"


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
    #: The files the ``--exec`` line names (:func:`command_paths`): readable to
    #: every run, so an agent kept in a folder the view empties (``/tmp``) starts.
    command: tuple[Path, ...] = ()

    @classmethod
    def start(cls, options: Options, env: Mapping[str, str]) -> Sandbox:
        """The harness's sandbox for ``options``: the system asked unless ``off``.
        Never refuses: ``required`` is checked by the command line before (exit 2)."""
        support = None if options.sandbox == "off" else probe()
        granted = granted_sockets(options.allow_write, env)
        if (support is not None and support.kind in ("bwrap", "landlock") and granted
                and seccomp.program() is not None):
            # The person lets runs reach a socket of theirs (ssh-agent to push):
            # the filter refuses every Unix socket, so it is off, and a socket in a
            # readable place of the home is reachable again: said, never silent.
            support = attrs.evolve(support, socket_filter=False, gaps=(
                *support.gaps, SOCKET_GRANT_GAP % ", ".join(map(str, granted))))
        home = env.get("HOME")
        return cls(mode=options.sandbox, support=support, allow_write=options.allow_write,
                   allow_read=options.allow_read, home=options.home,
                   user_home=Path(home) if home else Path.home(),
                   command=command_paths(options.exec_command, env))

    def close(self) -> None:
        """Nothing is kept between runs: here for the harness's exit."""

    @property
    def confines(self) -> bool:
        """Runs are confined: not ``off``, and the system can."""
        return self.support is not None and self.support.kind is not None

    @property
    def tmp_on_disk(self) -> bool:
        """A confined run's ``TMPDIR`` is a folder of its scratch folder, which the
        harness makes and removes (Landlock, Seatbelt); under bubblewrap it is the
        namespace's own ``/tmp`` (:data:`NAMESPACE_TMP`), and unconfined runs get none."""
        return self.confines and self.support is not None and self.support.kind != "bwrap"

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


def granted_sockets(allow_write: tuple[Path, ...], env: Mapping[str, str]) -> list[Path]:
    """The sockets ``--allow-write`` names: each grant that is a socket, and each
    socket a variable names (``SSH_AUTH_SOCK``, …) inside a grant, as
    :func:`~prohost.engine.agent.environment.without_sockets` passes it. Blocking
    (a stat per grant), once at start."""
    found: list[Path] = []
    for grant in allow_write:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.stat(grant).st_mode):
                found.append(grant)
    for name in SOCKET_VARIABLES:
        path = socket_path(name, env) if name in env else None
        if path is not None and any(path == grant or grant in path.parents
                                    for grant in allow_write):
            found.append(path)
    return list(dict.fromkeys(found))


def command_paths(exec_line: str, env: Mapping[str, str]) -> tuple[Path, ...]:
    """The files an ``--exec`` line names, as real paths: its program (found on the
    ``PATH`` of ``env`` when it is a bare name) and every word that is an absolute
    path to something that exists (an interpreter's script). The person chose them
    to run, so every run may read them, even where the confinement's view empties
    a folder (``/tmp``, ``/run``: an agent in ``/tmp/tools/bin``, or a checkout of
    prohost's own tests cloned under ``/tmp``). One inside a hidden place stays
    hidden (they are a policy's ``shown`` places). Blocking: it looks the words
    up once, at the harness's start."""
    words = split_command(exec_line)
    found: list[Path] = []
    index = program_index(words)
    if index is not None:
        program = shutil.which(words[index], path=env.get("PATH"))
        if program is not None:
            found.append(Path(program))
    found += [Path(word) for word in words if word.startswith("/") and os.path.exists(word)]
    # Each as named (so a folder the view empties shows the entry holding it) and
    # as its real path (so a link's target is there too).
    every = [*found, *(Path(os.path.realpath(path)) for path in found)]
    return tuple(dict.fromkeys(every))


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
    #: The run's lane (conversation): an ACP agent's folders of the harness's are
    #: the lane's own, so no conversation reads another's sessions, and no two runs
    #: at once share an overlay's upper folder (overlayfs leaves that undefined).
    lane: str = ""


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


#: The harness's own folder for runs' caches (:data:`defaults.CACHE_VARIABLES`),
#: under ``$PROHOST_HOME``.
CACHE_FOLDER = "cache"






















def cache_folders(home: Path) -> Path:
    """The harness's cache folder for runs' tools (made, with each tool's folder).

    Made once per harness and home (about fifteen ``mkdir`` calls a run otherwise),
    and again when the cache folder itself is gone (the person removed it; a run
    cannot: it is a grant's root). A tool's folder a run removed is the tool's to
    make again, inside the run's own grant. Blocking."""
    root = home / CACHE_FOLDER
    key = str(root)
    if key in _CACHES_MADE and os.path.isdir(key):
        return root
    for name in (*defaults.CACHE_VARIABLES.values(), defaults.MAVEN_REPOSITORY):
        (root / name).mkdir(mode=0o700, parents=True, exist_ok=True)
    _CACHES_MADE.add(key)
    return root


#: The cache folders made by :func:`cache_folders` (a set: adding is atomic).
_CACHES_MADE: set[str] = set()


class PlantedLink(ConfinementFailed):
    """A grant would pass through a symbolic link in a place a run may write."""


def refuse_planted_links(grants: list[Path], roots: list[Path]) -> None:
    """Raise :class:`PlantedLink` when a component of a grant, below one of ``roots``
    (places a run may write, and ``$PROHOST_HOME``), is a symbolic link: a run could
    have planted it there to widen a later run's grant (issue 36, attack 3). Looked
    at with lstat, never followed, every run (these are places a run may write).
    Blocking. On strings: pathlib's parsing was most of its cost."""
    root_paths = list(dict.fromkeys(os.path.normpath(root) for root in roots))
    looked: dict[str, bool] = {}
    for grant in grants:
        path = os.path.normpath(grant)
        for root in root_paths:
            prefix = root if root.endswith("/") else root + "/"
            if not path.startswith(prefix):
                continue
            component = root
            for name in path[len(prefix):].split("/"):
                component = f"{component.rstrip('/')}/{name}"
                linked = looked.get(component)
                if linked is None:
                    try:
                        linked = stat.S_ISLNK(os.lstat(component).st_mode)
                    except OSError:
                        linked = False
                    looked[component] = linked
                if linked:
                    log.warning("refusing to confine a run through %s: it is a symbolic "
                                "link inside %s, where a run may write; remove it", component,
                                root)
                    raise PlantedLink(
                        "one of its places would pass through a symbolic link where a run "
                        "may write (named in the harness's log): remove that link")


def hidden_places(sandbox: Sandbox) -> tuple[Path, ...]:
    """What every run of ``sandbox`` may not see: ``$PROHOST_HOME`` and the secret
    stores under ``$HOME`` (as named: whether each exists, and where it leads, is
    looked at every run, :mod:`prohost.engine.sandbox.bwrap`). Made once per harness."""
    key = (sandbox.home, sandbox.user_home)
    known = _HIDDEN.get(key)
    if known is None:
        known = (sandbox.home, *(sandbox.user_home / secret for secret in defaults.SECRETS))
        if len(_HIDDEN) > 64:  # tests' many homes: never grows without end
            _HIDDEN.clear()
        _HIDDEN[key] = known
    return known


_HIDDEN: dict[tuple[Path, Path], tuple[Path, ...]] = {}


_DEVICES = defaults.devices()


def policy_for(sandbox: Sandbox, places: RunPlaces, *, work: Path | None = None) -> Policy:
    """The run's policy (see the module docstring). ``work``: where the overlays'
    work folders are made (fresh: see :func:`agent_folders`). Blocking: it makes
    the folders a rule needs. Raises :class:`PlantedLink` when a grant would pass
    through a link a run could plant, :class:`PersonFolderRefused` when an ACP
    agent's folder of the person's cannot be shown to the run."""
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
    hidden = hidden_places(sandbox)
    overlays = work is not None and overlays_mount(sandbox.support, sandbox.home)
    own = agent_folders(places.brain, places.env, sandbox.user_home, sandbox.home,
                        work=work if overlays else None, hidden=hidden,
                        lane=places.lane)
    # The places the harness chooses (the person's --workdir and --allow-write are
    # theirs, links and all): none passes through a link a run could have planted.
    chosen = [places.scratch, *own.writable, cache_folders(sandbox.home)]
    refuse_planted_links(chosen, [sandbox.home, *writable, *chosen, *sandbox.allow_write])
    writable += chosen
    writable += _DEVICES
    writable += sandbox.allow_write
    return Policy(writable=tuple(writable), readable=tuple(readable), hidden=hidden,
                  shown=sandbox.command,
                  mounts=own.mounts, overlays=own.overlays)


@attrs.define
class RunConfinement:
    """A prepared confinement and the private ``TMPDIR`` it grants."""

    confinement: Confinement
    tmpdir: Path
    #: The harness's cache folder the run's tools are pointed at.
    caches: Path | None = None
    #: The overlays' work folders of this confinement (``None``: none made).
    overlay_work: Path | None = None
    #: (where the run sees it, the harness's folder behind it) for each agent
    #: folder bound or overlaid: where the harness reaches what the agent saved.
    own: tuple[tuple[Path, Path], ...] = ()

    def kept_at(self, seen: Path) -> Path:
        """Where the harness reaches ``seen`` (a path as the run sees it): inside an
        agent folder of the harness's shown at the person's, that folder's path."""
        for place, kept in self.own:
            if seen == place or place in seen.parents:
                return kept / seen.relative_to(place)
        return seen

    def close(self) -> None:
        """Close the confinement and remove its overlays' work folders (a few empty
        folders, the run's processes gone: overlayfs leaves its own ``work`` inside
        at mode 0, so it is opened up first)."""
        self.confinement.close()
        if self.overlay_work is not None:
            remove_work_folders(self.overlay_work)




def make(sandbox: Sandbox, support: Support, places: RunPlaces) -> RunConfinement:
    """The attempt's confinement, made now, anew: every place a run can write is
    looked at again (what a run changed cannot carry a grant into the next); only
    what no run can change is made once per harness (:func:`cache_folders`,
    :func:`hidden_places`). Blocking."""
    if support.kind == "bwrap":
        tmpdir = NAMESPACE_TMP  # the namespace's tmpfs: nothing to make
    else:
        tmpdir = places.scratch / TMP_NAME
        make_private_folder(tmpdir)
    if places.workdir is not None:
        # A grant needs the folder (one that does not exist gets none), and one
        # removed between runs is made again.
        places.workdir.mkdir(parents=True, exist_ok=True)
    work = new_work_folder(sandbox.home)
    try:
        policy = policy_for(sandbox, places, work=work)
        own = (*((seen, kept) for kept, seen in policy.mounts),
               *((seen, kept) for seen, kept, _ in policy.overlays))
        return RunConfinement(prepare(policy, support), tmpdir,
                              sandbox.home / CACHE_FOLDER, work, own)
    except BaseException:
        remove_work_folders(work)
        raise


async def confine(sandbox: Sandbox, places: RunPlaces, deadline: float,
                  bounds: Bounds) -> RunConfinement | None:
    """The run's confinement, prepared in a worker thread within ``deadline`` (trio
    time) and the file steps' bound; ``None`` when runs are not confined. Raises
    :class:`ConfinementFailed` when it cannot be made: the agent must not start.

    Cancelled: the worker thread is abandoned (the shielded bound of
    :meth:`Bounds.file_step`); what it makes after that is closed by it, and a
    ``TMPDIR`` it made on the disk (Landlock, Seatbelt) is removed with the
    scratch folder.
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
    base = str(root)
    result = {name: f"{base}/{folder}" for name, folder in defaults.CACHE_VARIABLES.items()}
    maven = f"-Dmaven.repo.local={base}/{defaults.MAVEN_REPOSITORY}"
    before = env.get("MAVEN_OPTS", "").strip()
    result["MAVEN_OPTS"] = f"{before} {maven}" if before else maven
    return result


def grant_problems(options: Options, user_home: Path, owner: str = "") -> list[str]:
    """Why ``options`` would grant runs a place that holds what they must not see
    (§13: ``--workdir ~``, an ``--allow-write`` of a folder holding
    ``$PROHOST_HOME`` or a secret store), one line each with what to do; empty when
    none would, or with ``--sandbox off`` (nothing is confined then). Refused at
    start, exit 2: a grant is a whole hierarchy, and a hidden place inside one
    cannot be hidden, so the harness would say confined while it is not.
    ``user_home``: ``$HOME`` as the harness sees it; ``owner``: whose own folders
    runs are granted (:attr:`Brain.folders_owner`). Blocking (resolves paths)."""
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
    problems += _shadowed_grants(options, home, owner)
    # Runs write their account's folder (settings, hooks): never the one the
    # person's own sessions use.
    own = {*(home / default for _, default in FOLDER_VARIABLES.values()),
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


def _shadowed_grants(options: Options, home: Path, agent: str) -> list[str]:
    """The ``--allow-write`` grants at or inside a folder of ``agent`` (whose own
    folders runs are granted: an ACP agent's ``~/.gemini``, …): each run sees that
    folder as an overlay whose writes land in the harness's own
    (:func:`agent_folders`), so the grant would do nothing the person meant,
    silently. One line each."""
    problems = []
    for folder in defaults.AGENT_FOLDERS.get(agent, ()):
        place = home / folder
        places = {place, place.resolve()}
        for path in options.allow_write:
            real = path.resolve()
            if any(real == one or one in real.parents for one in places):
                problems.append(
                    f"--allow-write {path} is inside ~/{folder}, {agent}'s own folder, which "
                    f"its runs never write: they see it through an overlay whose writes land "
                    f"in the harness's folder ($PROHOST_HOME/{AGENTS_FOLDER}/{agent}/…), so "
                    "the grant would have no effect; drop it, or grant a folder outside it")
    return problems
