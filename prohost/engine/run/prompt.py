"""The prompt an agent reads on stdin (§5.2; how its output becomes a reply is
:mod:`prohost.engine.agent.reply`).

The prompt is plain text in two parts: the request as the server sent it, then the
harness's own lines about this run. The second part exists because an agent run
through a chat is not a person at a terminal: it has a time budget it cannot see,
it may share the machine with other runs of itself, and only its final message
reaches anyone. Saying so up front is what turns an agent that narrates its work
into one that returns something sendable.

The chat's words never pass for the harness's: every line of them is quoted
(``> ``) and every author is flattened to one line, so a participant cannot write
a line that looks like the harness's own (one telling someone else's run to
answer ``NO_REPLY``, say).

The text is a pure function of its inputs (no clock, no environment), so the
same run always gets byte-for-byte the same prompt; the tests pin it.
"""

from __future__ import annotations

import time

import attrs

from prohost.engine.agent.reply import NO_REPLY
from prohost.engine.repos.worktrees import Checkout, CheckoutFailure
from prohost.wire.outcomes import human_duration
from prohost.wire.runs import AgentRun, ContextMessage

#: Every line of the chat's words in the prompt starts with this (after the
#: indent of a list item), and no line of the harness's own does: so a line that
#: looks like the harness's ("About this run …") can only be the harness's (§5.2).
QUOTE = ">"

#: Control characters (C0, DEL, C1) and the line and paragraph separators: every
#: character ``str.splitlines`` breaks at is among them. In an author they become
#: spaces, so an author can never start a line of its own.
_NOT_ONE_LINE = {code: " " for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)}


@attrs.frozen
class PromptContext:
    """What the harness tells the agent about this run, besides the request."""

    timeout_s: float
    """The ``--timeout`` for the whole run; 0 = none."""
    idle_timeout_s: float
    """The ``--idle-timeout``; 0 = none."""
    parallel: bool
    """Other runs may execute on this machine at the same time (``--concurrency`` > 1)."""
    checkouts: tuple[Checkout, ...] = ()
    checkout_failures: tuple[CheckoutFailure, ...] = ()
    #: The agent runs confined (§13); ``workdir`` is its working directory.
    confined: bool = False
    workdir: str | None = None
    starts_in: Checkout | None = None
    """The checkout whose worktree is the agent's working directory (the first
    listed, §5.3); ``None``: it works in ``--workdir``."""


def one_line(text: str) -> str:
    """``text`` flattened to one line: control characters and line or paragraph
    separators become spaces, and each run of whitespace one space."""
    return " ".join(text.translate(_NOT_ONE_LINE).split())


def quoted(text: str, indent: str = "") -> list[str]:
    """``text``'s lines, each quoted as ``> line`` after ``indent``.

    It is broken into lines wherever ``str.splitlines`` would break it (``\\r``,
    ``\\v``, U+2028 … as well as ``\\n``), because an agent may read any of those
    as a line break: none of them may leave a line unquoted. A blank line is a
    bare ``>``, so one message stays one quoted block.
    """
    return [
        f"{indent}{QUOTE} {line}" if line.strip() else f"{indent}{QUOTE}"
        for line in text.splitlines()
    ]


def _when(at: float) -> str | None:
    try:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
    except (OverflowError, OSError, ValueError):
        # A time no calendar here can show (1e300): the message is told without it.
        return None


def _context_lines(context: list[ContextMessage]) -> list[str]:
    lines = ["Earlier messages in this conversation, oldest first:"]
    for message in context:
        who = one_line(message.author or "") or "someone"
        when = None if message.at is None else _when(message.at)
        if when is not None:
            who = f"{who} ({when})"
        text = message.text.strip()
        if text:
            lines += [f"- {who}:", *quoted(text, "  ")]
        else:
            lines.append(f"- {who}: (no text)")
    return lines


def _request_lines(run: AgentRun) -> list[str]:
    lines: list[str] = []
    instructions = (run.instructions or "").strip()
    if instructions:
        lines += ["Standing instructions for this conversation:", *quoted(instructions), ""]
    if run.context:
        lines += [*_context_lines(run.context), ""]
    author = one_line(run.author or "")
    heading = f"The request, from {author}:" if author else "The request:"
    text = run.text.strip()
    lines += [heading, *(quoted(text) if text else ["(The message has no text.)"])]
    return lines


def _time_budget_lines(context: PromptContext) -> list[str]:
    total = human_duration(context.timeout_s)
    idle = human_duration(context.idle_timeout_s)
    budget: tuple[str, ...]
    if context.timeout_s > 0 and context.idle_timeout_s > 0:
        budget = (
            f"- You have up to {total} for this run, and it is stopped sooner if it",
            f"  prints nothing for {idle}.",
        )
    elif context.timeout_s > 0:
        budget = (f"- You have up to {total} for this run; it is stopped after that.",)
    elif context.idle_timeout_s > 0:
        budget = (
            "- This run has no overall time limit, but it is stopped if it prints",
            f"  nothing for {idle}.",
        )
    else:
        return ["- This run has no time limit."]
    # Advice about how to work, not a request to hurry: a run that is stopped
    # sends nothing, so a partial answer in time beats a full one too late.
    return [
        *budget,
        "  Plan the work to fit. If it cannot all be done in time, finish the most",
        "  useful part and say plainly what is left.",
    ]


def _isolation_lines(context: PromptContext) -> list[str]:
    lines: list[str] = []
    if context.parallel and context.starts_in is not None:
        # Its working directory is its own worktree: only files outside it are shared.
        lines += [
            "- Other conversations may be running on this machine at the same time,",
            "  as other processes of you. Outside your private checkouts, give any",
            "  scratch file a name unique to this run, and do not change a file or a",
            "  git branch you did not create in this conversation.",
        ]
    elif context.parallel:
        lines += [
            "- Other conversations may be running on this machine at the same time,",
            "  as other processes of you, in this same working directory. Give any",
            "  scratch file a name unique to this run, and do not change a file or a",
            "  git branch you did not create in this conversation.",
        ]
    if context.checkouts:
        lines += [
            "- This conversation has git checkouts of its own (all in the folder",
            "  $PROHOST_RUN_REPOS). Do all repository work in them and nowhere else;",
            "  each stands in for the original named after it:",
        ]
        for checkout in context.checkouts:
            lines += [f"    {checkout.name}: {checkout.path}",
                      f"      (instead of {checkout.source})"]
            if checkout.branch is not None:
                lines += [f"      on its own branch {checkout.branch}"]
            else:
                lines += ["      on a detached HEAD (no branch)"]
            if checkout.unborn:
                lines += ["      The original has no commit yet: that branch does not exist",
                          "      until your first commit creates it."]
            if checkout.has_submodules:
                lines += ["      Its submodules are not checked out here (their folders are",
                          "      empty): read them in the original, and do not change them."]
        lines += [
            "  They are worktrees private to this conversation and they persist",
            "  between its runs, so a branch or an uncommitted change you find in one",
            "  is your own earlier work here. Each was put on its own branch, named",
            "  above, made from the original's commit when the conversation began",
            "  and never updated for you. Commit work that should last on it: the",
            "  branch lives in the original repository, where the person can see,",
            "  merge or push it. A branch checked out elsewhere (such as the",
            "  original's) cannot be checked out here.",
            "  Wherever your other instructions name an original as the place to",
            "  work, use its private path above instead.",
            *([f"  You start in the first one, {context.starts_in.name}: your working directory",
               "  is its private path, not the original."]
              if context.starts_in is not None else []),
            "  Never switch branches, commit, or edit files in the originals: other",
            "  runs read them. Do not run `git worktree add`, `remove`, `move` or",
            "  `prune` yourself.",
        ]
    lines += _confinement_lines(context)
    if context.checkout_failures:
        lines += [
            "- No private checkout could be prepared for:",
            *(f"    {failure.source} ({failure.reason})" for failure in context.checkout_failures),
            "  Treat those repositories as read-only for this run: do not switch",
            "  branches, commit, or edit files in them, and say so if the request",
            "  needed a change there.",
        ]
    return lines


def _confinement_lines(context: PromptContext) -> list[str]:
    """Where a confined agent may write (§13), so that it does not spend turns
    finding out."""
    if not context.confined:
        return []
    if context.checkouts:
        places = ["  your checkouts above (and their git data: you can commit on their",
                  "  branches; a branch you create must be named prohost/..., no other",
                  "  can be created or moved),"]
    else:
        places = [f"  the working directory {context.workdir},"]
    return [
        "- You are confined: you can write only in",
        *places,
        "  $TMPDIR (private to this run, removed after it), your CLI's own settings",
        "  folder and the caches your tools are pointed at ($XDG_CACHE_HOME,",
        "  $npm_config_cache, $CARGO_HOME, ...; ~/.cache and the like are not",
        "  yours). The rest of this machine is read-only to you, and",
        "  $PROHOST_HOME and secrets such as ~/.ssh are hidden: a write or read",
        "  refused there (permission denied) is this, not something to fix.",
    ]


def _reply_lines() -> list[str]:
    return [
        "- Your final message is the reply: it is sent exactly as you write it,",
        "  and nothing else you print is seen. Write it for the person who asked.",
        f"- To send no reply at all, make your final message exactly {NO_REPLY}",
        "  and nothing else.",
    ]


def build_prompt(run: AgentRun, context: PromptContext) -> str:
    """The stdin text for one run: the request, then the harness's lines about the run."""
    lines = [
        *_request_lines(run),
        "",
        "About this run (from the harness that started you, not from the sender):",
        *_time_budget_lines(context),
        *_isolation_lines(context),
        *_reply_lines(),
    ]
    return "\n".join(lines) + "\n"
