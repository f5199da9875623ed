"""The sentences a run's outcome says to the server (docs/protocol.md §6, §7, §9, §12), in
one place: the ``error`` of every failure the harness itself reports, so that a
reader (or a server matching on them) finds them all here, and a test can name
each one. What an agent CLI says of its own failure is the brain's
(:mod:`prohost.engine.agent.brains`); what the harness says while preparing and
spawning a run (§5) is :mod:`prohost.engine.run.execute`'s.
"""

from __future__ import annotations

import datetime as dt
import math
import os
from collections.abc import Iterable, Sequence

# --------------------------------------------------------------------------- §6 cancellation

#: A ``cancel`` without a reason, and every ``heartbeat_ack.cancel``.
DEFAULT_CANCEL_REASON = "cancelled by the server"


def cancelled(reason: str) -> str:
    """A cancelled run's error: ``cancelled: <reason>``."""
    return f"cancelled: {reason}"


# --------------------------------------------------------------------------- §7 results

#: A run ``started`` but not ``finished`` when the harness started again.
RESTARTED = "the harness restarted before this run finished"
#: A run the ledger has as ``started`` that nothing in this process runs any more.
INTERRUPTED = "the harness lost track of this run before it finished"
#: A run the scheduler could not take (a ledger holding more queued runs than the cap).
QUEUE_FULL = "the agent's queue is full; the run was not started"
#: The agent exited 0 and its brain could read no reply from what it printed.
NO_READABLE_REPLY = "the agent exited without a reply the harness could read"
#: A run whose confinement (§13) could not be made or applied: its agent never ran,
#: and never runs unconfined in its place. Followed by ``: <why>``.
NOT_CONFINED = "the agent could not be confined, so it was not started"


def internal_error(detail: str) -> str:
    """A fault of the harness's own (retryable): ``internal error: <detail>``."""
    return f"internal error: {detail}"


#: What an absolute path no place names becomes in a text for the server (§7).
LOCAL_PATH = "<local path>"


def without_local_paths(text: str, places: Iterable[tuple[os.PathLike[str] | str, str]],
                        paths: Iterable[object] = ()) -> str:
    """``text`` naming no local path (§7: no text sent to the server does): each
    ``(path, name)`` of ``places`` written as its name (its real path too; the
    longest first, so a folder inside another keeps its own name), the user's home
    as ``~``, and then each of ``paths`` still absolute (an ``OSError``'s
    ``filename``, say) as :data:`LOCAL_PATH`."""
    pairs: list[tuple[str, str]] = []
    for where, name in places:
        for form in (os.fspath(where), os.path.realpath(where)):
            pairs.append((form.rstrip("/") or "/", name))
    user_home = os.path.expanduser("~")
    if user_home not in ("", "/", "~"):
        pairs += [(user_home, "~"), (os.path.realpath(user_home), "~")]
    for where, name in sorted(pairs, key=lambda pair: -len(pair[0])):
        if where != "/":
            text = text.replace(where, name)
    for path in paths:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if isinstance(path, str) and os.path.isabs(path):
            scrubbed = without_local_paths(path, places)
            for form in {path, scrubbed}:
                if os.path.isabs(form) and form != "/":
                    text = text.replace(form, LOCAL_PATH)
    return text


#: A ``finished`` row whose saved outcome cannot be read back at restart (a ledger
#: written by another version, or damaged): the run is reported retryable, since
#: what it did is lost to the harness, not to the request.
UNREADABLE_OUTCOME = internal_error("the saved outcome could not be read")


def _plural(count: float, unit: str) -> str:
    number = f"{count:g}"
    return f"{number} {unit}" if number == "1" else f"{number} {unit}s"


def human_duration(seconds: float) -> str:
    """Say a limit in the unit a reader thinks in.

    ``0`` (or less) is "no limit". Under two minutes it is seconds (but a minute is
    "1 minute"); whole hours are
    hours; anything else up to ten hours is whole minutes, rounded down so the
    agent is never told it has more time than it has; beyond that, hours.
    """
    if seconds <= 0:
        return "no limit"
    if seconds < 60 or (seconds < 120 and seconds != 60):
        return _plural(round(seconds, 1), "second")
    if seconds % 3600 == 0:
        return _plural(seconds // 3600, "hour")
    if seconds < 10 * 3600:
        return _plural(math.floor(seconds / 60), "minute")
    return _plural(math.floor(seconds / 360) / 10, "hour")


def limit_phrase(seconds: float) -> str:
    """ "45 minutes" as in "the 45-minute limit"."""
    number, _, unit = human_duration(seconds).partition(" ")
    return f"{number}-{unit.removesuffix('s')}"


def ran_too_long(timeout_s: float) -> str:
    """The run's ``--timeout`` stopped the agent."""
    return f"the agent ran longer than the {limit_phrase(timeout_s)} limit (--timeout)"


def printed_nothing(idle_timeout_s: float) -> str:
    """The run's ``--idle-timeout`` stopped the agent."""
    return f"the agent printed nothing for {human_duration(idle_timeout_s)} (--idle-timeout)"


def killed_by(signal: str, last_stderr_line: str | None = None) -> str:
    """The agent died of ``signal`` (its name, ``SIGKILL``)."""
    error = f"the agent was killed by {signal}"
    return f"{error}: {last_stderr_line}" if last_stderr_line else error


def exited_with(status: int | None, last_stderr_line: str | None = None) -> str:
    """The agent exited with a status other than 0 and said nothing the brain read."""
    error = f"the agent exited with status {status}"
    return f"{error}: {last_stderr_line}" if last_stderr_line else error


# --------------------------------------------------------------------------- §5.5 ACP agents

#: What an ACP agent's stop reason other than ``end_turn`` says (§5.5): the run
#: failed, and trying it again as it is would end the same way (not retryable).
ACP_STOP_REASONS = {
    "refusal": "the agent refused to continue (ACP stop reason: refusal)",
    "max_tokens": "the agent reached its maximum number of tokens before it finished "
                  "(ACP stop reason: max_tokens)",
    "max_turn_requests": "the agent reached its maximum number of model requests for one "
                         "turn before it finished (ACP stop reason: max_turn_requests)",
    "cancelled": "the agent cancelled the turn by itself (ACP stop reason: cancelled)",
}


def acp_stopped(reason: str) -> str:
    """The failure for an ACP ``stopReason`` other than ``end_turn``."""
    known = ACP_STOP_REASONS.get(reason)
    return known or f"the agent stopped with a reason prohost does not know ({reason!r})"


#: The agent ended the conversation (exit 0) before it answered the prompt.
ACP_NO_ANSWER = "the agent ended the ACP connection before it answered the prompt"


#: The run carries an MCP server and the agent takes none over HTTP.
ACP_NO_HTTP_MCP = ("the run's MCP server could not be given to the agent: it does not "
                   "take MCP servers over HTTP (ACP mcpCapabilities.http)")


def acp_signed_out(detail: str, variables: Sequence[str] = ()) -> str:
    """The agent answered "authentication required" (ACP error -32000): nobody is
    logged in to it on this machine, and none of the keys it takes from its
    environment (``variables``, from its ``env_var`` auth methods) is set."""
    keys = ""
    if variables:
        keys = f", or set {' or '.join(variables)} in the environment prohost runs it in"
    return (f"the agent is not logged in on this machine ({detail}); log in with the "
            f"agent's own command there{keys}, and try again")


def acp_no_reply(refused: str | None) -> str:
    """The agent ended its turn (``end_turn``) without a word: no reply is not a
    success. ``refused``: the tool ``--safe-tools`` refused just before."""
    if refused is None:
        return "the agent ended its turn without a reply"
    return (f"the agent ended its turn without a reply after prohost refused a tool it "
            f"asked for (--safe-tools): {refused}")


def acp_refusal_ended(refused: str) -> str:
    """``--safe-tools`` refused a tool with the only refusal the agent offered, one
    that ends its turn (codex-acp's ``abort``), and the turn ended there."""
    return (f"the agent ended its turn when prohost refused a tool it asked for "
            f"(--safe-tools: {refused}); it offered no way to refuse and go on")


def acp_version(version: object) -> str:
    """The agent answered ``initialize`` with a protocol version other than 1."""
    return (f"the agent speaks ACP protocol version {version!r}; prohost speaks version 1")


# --------------------------------------------------------------------------- §9 shutdown

#: A queued run (or one waiting for an account) when the harness began to drain.
NOT_STARTED = "the agent is shutting down; the run was not started"
#: A running run at the second signal.
STOPPED = "the agent was stopped"


# --------------------------------------------------------------------------- §12 accounts


def iso_time(epoch: float) -> str:
    """An epoch time as ISO 8601 in UTC, to the second: ``2026-12-02T20:00:00Z``."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def all_limited_reason(until: float | None) -> str:
    """§12's words for "no account can take work", with the earliest reset (also the
    503 ack's reason)."""
    when = iso_time(until) if until is not None else "an unknown time"
    return f"every account is at its usage limit until {when}"


def dollars(usd: float) -> str:
    """``2.5``, ``0.0001``: at most four decimals, as --max-cost takes them."""
    return f"{usd:.4f}".rstrip("0").rstrip(".")


def budget_reached(max_cost_usd: float | None, spent_usd: float | None) -> str:
    """A run stopped at its ``--max-cost``: ``the run reached its budget of $<max-cost>
    (it spent $<cost>)``, each part only when known."""
    budget = "its budget" if max_cost_usd is None else f"its budget of ${dollars(max_cost_usd)}"
    spent = "" if spent_usd is None else f" (it spent ${spent_usd:.4f})"
    return f"the run reached {budget}{spent}"
