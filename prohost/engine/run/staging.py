"""What a run's attempts stand on, made by the runner before them: the prompt, the
agent's environment, and per account the private MCP folder (removed after the
run). Pure steps and bounded file steps; none of them knows the runner.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path

from prohost.engine.accounts.book import Account
from prohost.engine.accounts.logins import open_cli_folders
from prohost.engine.agent.brains.base import Brain, McpError, McpWiring
from prohost.engine.agent.environment import agent_env, make_private_folder
from prohost.engine.blocking import Bounds, StepTimedOut
from prohost.engine.repos.worktrees import RUN_REPOS_ENV, PreparedCheckouts
from prohost.engine.run.confine import RunConfinement
from prohost.engine.run.execute import ExecSpec
from prohost.engine.run.prompt import PromptContext, build_prompt
from prohost.engine.sandbox import defaults
from prohost.wire.runs import AgentRun

log = logging.getLogger("prohost.execute")

#: Bound on sharing the account's login (s): two small files read, at most one written.
LOGIN_SHARE_S = 5.0
#: Bound on removing a run's MCP folder after the run (s): it holds a few small
#: files, and the run's report waits for it.
SCRATCH_REMOVE_S = 5.0


def prompt_for(run: AgentRun, spec: ExecSpec, prepared: PreparedCheckouts | None,
               *, confined: bool = False) -> str:
    """The prompt every attempt of ``run`` gets (§5.2), naming its private
    checkouts and those that could not be made, and where it may write when it
    runs ``confined`` (§13)."""
    return build_prompt(
        run,
        PromptContext(
            timeout_s=spec.timeout_s,
            idle_timeout_s=spec.idle_timeout_s,
            parallel=spec.parallel,
            checkouts=prepared.checkouts if prepared else (),
            checkout_failures=prepared.failures if prepared else (),
            confined=confined,
            workdir=str(spec.workdir),
            starts_in=prepared.first if prepared else None,
        ),
    )


def workdir_for(spec: ExecSpec, prepared: PreparedCheckouts | None,
                private: Path | None = None) -> Path:
    """Where the agent of a run starts (§5.3): with ``--repos``, the conversation's
    worktree of the first listed checkout, so that a plain agent's edits land in
    its own checkout; else ``--workdir``. A confined run with ``--repos`` whose
    first checkout could not be prepared starts in the folder holding the others,
    or else in ``private`` (its ``TMPDIR``): ``--workdir`` is none of its places
    then (§13), and it could not start there."""
    if prepared is not None and prepared.first is not None:
        return Path(prepared.first.path)
    if private is not None:
        return prepared.folder if prepared is not None and prepared.folder else private
    return spec.workdir


def env_for(run: AgentRun, spec: ExecSpec, base_env: Mapping[str, str],
            prepared: PreparedCheckouts | None) -> dict[str, str]:
    """The agent's environment before any account's variables: ``base_env`` with
    the run's markers, without secrets and git's locating variables, and with the
    folder of its private checkouts (``--repos``)."""
    env = agent_env(base_env, run.run_id, spec.secrets)
    if prepared is not None and prepared.folder is not None:
        env[RUN_REPOS_ENV] = str(prepared.folder)
    return env


def mcp_folder(scratch: Path, accounts_tried: int) -> Path:
    """The run's MCP folder for the account it tries after ``accounts_tried``
    others: each account gets its own (Codex's overlay is built over the account's
    own folder)."""
    return scratch / f"account-{accounts_tried}" if accounts_tried else scratch


async def wire_mcp(run: AgentRun, brain: Brain, folder: Path, env: Mapping[str, str],
                   bounds: Bounds) -> McpWiring | None:
    """The brain's MCP configuration for ``run`` in ``folder`` (private to the run),
    or ``None`` for a run without an MCP server. Raises :class:`McpError` when it
    cannot be written: the run then fails closed, its agent never spawned.

    Cancelled: as :meth:`prohost.engine.blocking.Bounds.file_step`.
    """
    if run.mcp is None:
        return None
    try:
        # Abandoning either is safe: they write only in the run's own folder,
        # which the runner removes, or the next start's sweep does.
        await bounds.file_step(make_private_folder, folder,
                               what="creating the run's MCP folder")
        return await bounds.file_step(brain.wire_mcp, run.mcp, folder, env,
                                      what="writing the run's MCP configuration")
    except OSError as exc:
        # The folder is the harness's own; the server hears no local path (§7).
        log.warning("run %s: could not write its MCP configuration in %s: %s",
                    run.run_id, folder, exc)
        raise McpError("could not write its configuration in the run's private folder: "
                       f"{exc.strerror or type(exc).__name__}") from None


async def remove_scratch(run: AgentRun, scratch: Path, bounds: Bounds, *,
                         made: bool = False) -> None:
    """Remove the run's MCP folder (and the private ``TMPDIR`` of a confined run,
    ``made``: it is removed whatever the agent left in it), also after a
    configuration that failed half-way
    (the folder is this run's alone: see
    :func:`prohost.engine.agent.environment.scratch_folder`). Never raises.

    Cancelled: bounded (:meth:`Bounds.file_step` is shielded) and abandoned at its
    bound, which is safe: the folder is no one else's, and one a hung disk leaves
    behind (with its 0600 token) is swept at the next start
    (:mod:`prohost.engine.supervisor.upkeep`).
    """
    if run.mcp is None and not made:
        return
    with contextlib.suppress(OSError):
        await bounds.file_step(_remove, scratch, limit_s=SCRATCH_REMOVE_S,
                               what="removing the run's scratch folder")


def _remove(scratch: Path) -> None:
    """Remove ``scratch`` and all it holds: by ``rmdir`` when all it holds is empty
    folders (a confined run's unused ``TMPDIR``, most runs: a tree walk cost them
    a third of a millisecond), else by a tree walk. Blocking."""
    try:
        for folder in (*scratch.iterdir(), scratch):
            folder.rmdir()
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)


async def share_login(account: Account, cli: str, env: Mapping[str, str],
                      bounds: Bounds, lane_folder: str = "") -> None:
    """Make the conversation's own folder of ``account`` for ``cli`` (the brain, or
    the agent an ACP command starts; ``lane_folder``: the lane's folder name) and
    keep its login one with the account's, at an attempt's start and end: the
    newer copy wins, Codex's ``config.toml`` seeded one way from the person's
    (``env``: the harness's own, where the person's folder is found;
    :func:`~prohost.engine.accounts.logins.open_cli_folders`). Never raises but a
    cancel.

    Cancelled: bounded and shielded (:meth:`Bounds.file_step`); an abandoned copy
    is a rename, whole or not at all, and the next attempt's takes the newer again.
    """
    if account.cli_folder(cli, lane_folder) is None:
        return
    try:
        # Nothing is read from a secret store (Codex's settings are seeded too).
        home = env.get("HOME", "").strip()
        hidden = defaults.secrets(Path(home) if home else Path.home())
        await bounds.file_step(open_cli_folders, account, cli, lane_folder, env, hidden,
                               limit_s=LOGIN_SHARE_S, what="sharing the CLI's login")
    except StepTimedOut:
        log.warning("sharing the %s login of account %s did not finish in time", cli,
                    account.name)


#: How long mending an agent's saved session may take (a rename or two).
MEND_S = 10.0


async def mend_session(brain: Brain, session: str | None, env: Mapping[str, str],
                       confined: RunConfinement | None, bounds: Bounds) -> None:
    """Let ``brain`` mend the agent's saved session before an attempt takes
    ``session`` back (:meth:`Brain.before_spawn`; Gemini CLI's, renamed out of its
    bugs' way), in the folder of the harness's the run sees at the agent's.
    Never raises but a cancel: a mend that did not finish leaves the turn to start
    a new session, as it would have.

    Cancelled: bounded and shielded (:meth:`Bounds.file_step`); a rename is whole
    or not at all.
    """
    if session is None:
        return  # a new session: nothing saved to mend
    try:
        await bounds.file_step(brain.before_spawn, session, env,
                               confined.kept_at if confined is not None else Path,
                               limit_s=MEND_S, what="mending the agent's saved session")
    except StepTimedOut:
        log.warning("mending the agent's saved session %s did not finish in time", session)
