"""What a run's agent is given besides its prompt: its environment and its private folder.

Both are pure and the same for every brain: the environment is the harness's own
minus anything that holds a secret, plus markers naming the run; the private
folder (for the brain's MCP configuration) is named by a digest of the run id,
never by the id itself (§3). :mod:`prohost.engine.run.execute` uses both for every
attempt; :mod:`prohost.engine.run.runner` names the folder.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from prohost.engine.repos.gitcmd import GIT_LOCATION_VARS

#: Set to ``1`` for every agent the harness starts, so instructions the agent reads
#: from disk can tell a paired run (someone is waiting in a thread) from any other.
PAIRED_RUN_ENV = "PROHOST_PAIRED_RUN"
RUN_ID_ENV = "PROHOST_RUN_ID"

#: Hex digits of a run id's SHA-256 that name its scratch folder: 128 bits, so
#: two run ids never meet by chance, and the name is short and plain.
SCRATCH_NAME_CHARS = 32

#: Claude Code sets this in its own shells. A harness started from one would
#: pass it on, and the agent would then believe it was nested inside Claude Code.
_NESTED_CLAUDE_ENV = "CLAUDECODE"
#: Never passed on: Claude Code's nesting marker, and the variables that point git at
#: one repository (a harness started from a git hook or an editor's terminal has
#: them). The agent works in its own checkouts: with GIT_DIR or GIT_INDEX_FILE
#: inherited, every git command it runs would read and write that other
#: repository instead, whatever its working directory.
_DROPPED = frozenset({_NESTED_CLAUDE_ENV, *GIT_LOCATION_VARS})


def scratch_folder(root: Path, run_id: str) -> Path:
    """The run's private folder under ``root``: named by a digest of the run id.

    Never the id as it stands: the id comes from the wire, and ``..`` or ``.``
    would name ``$PROHOST_HOME`` or ``root`` itself, which the run's cleanup then
    removes (§3: no body field is ever used as a file or folder name). A hex
    digest cannot hold a separator, a dot, NUL, or run over 255 bytes.
    """
    return root / run_digest(run_id)


def run_digest(run_id: str) -> str:
    """The name a run's own file or folder is given (its scratch folder, its kept
    stderr): :data:`SCRATCH_NAME_CHARS` hex digits of a digest of the run id. A name
    made once stays the same, so files an earlier harness left are found again."""
    # surrogatepass: a run id is JSON text, which can carry a lone surrogate.
    return hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[
        :SCRATCH_NAME_CHARS]


def make_private_folder(path: Path) -> None:
    """Create ``path`` (and its parents) readable by this user only, even if it existed.

    Blocking: call it through ``trio.to_thread``.
    """
    # Each missing folder made 0700 too, not only the last: mkdir's parents get
    # 0777 less the umask, which left a run's scratch folder readable by others
    # ($PROHOST_HOME/runs/<digest>, issue 37); chmod, since the umask narrows mode.
    missing = []
    folder = path
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        folder.chmod(0o700)
    path.chmod(0o700)


def agent_env(base: Mapping[str, str], run_id: str, secrets: Sequence[str]) -> dict[str, str]:
    """The environment an agent runs with: ``base`` plus the run's markers, minus secrets
    and git's repository-locating variables.

    A variable is dropped when its value contains a secret anywhere, not only when
    it equals one: ``Authorization: Bearer <token>`` in some variable leaks as much.
    """
    needles = [secret for secret in secrets if secret]
    env = {
        name: value
        for name, value in base.items()
        if name not in _DROPPED and not any(needle in value for needle in needles)
    }
    env[PAIRED_RUN_ENV] = "1"
    env[RUN_ID_ENV] = run_id
    return env
