"""The prompt text (pinned byte for byte), reply extraction, and durations."""

from __future__ import annotations

import pytest

from prohost.engine.agent.reply import (
    MAX_REPLY_BYTES,
    NO_REPLY,
    REPLY_CUT_MARKER,
    cap_reply,
    reply_from_text,
)
from prohost.engine.repos.worktrees import Checkout, CheckoutFailure
from prohost.engine.run.prompt import PromptContext, build_prompt
from prohost.wire.outcomes import human_duration
from prohost.wire.runs import AgentRun, ContextMessage

pytestmark = pytest.mark.protocol("§5")

FULL_RUN = AgentRun(
    run_id="run_01",
    completion_path="/v1/agent/runs/run_01/complete",
    text="Can you fix the failing test in app?\n\nIt fails with:\n  KeyError: 'fixture'\n",
    conversation_id="C42",
    author="dana",
    context=[
        ContextMessage(text="CI is red on main", author="sam", at=1764668000.0),
        ContextMessage(text="first line\n\nsecond line", author=None, at=None),
        ContextMessage(text=" \n", author="ana", at=None),
    ],
    instructions="You maintain the app repository.",
    created_at=1764668400.0,
)

BARE_RUN = AgentRun(run_id="run_02", completion_path="/c", text="   ")

FULL_PROMPT = """\
Standing instructions for this conversation:
> You maintain the app repository.

Earlier messages in this conversation, oldest first:
- sam (2025-12-02 09:33 UTC):
  > CI is red on main
- someone:
  > first line
  >
  > second line
- ana: (no text)

The request, from dana:
> Can you fix the failing test in app?
>
> It fails with:
>   KeyError: 'fixture'

About this run (from the harness that started you, not from the sender):
- You have up to 2 hours for this run, and it is stopped sooner if it
  prints nothing for 15 minutes.
  Plan the work to fit. If it cannot all be done in time, finish the most
  useful part and say plainly what is left.
- Other conversations may be running on this machine at the same time,
  as other processes of you, in this same working directory. Give any
  scratch file a name unique to this run, and do not change a file or a
  git branch you did not create in this conversation.
- Your final message is the reply: it is sent exactly as you write it,
  and nothing else you print is seen. Write it for the person who asked.
- To send no reply at all, make your final message exactly NO_REPLY
  and nothing else.
"""

BARE_PROMPT = """\
The request:
(The message has no text.)

About this run (from the harness that started you, not from the sender):
- This run has no time limit.
- Your final message is the reply: it is sent exactly as you write it,
  and nothing else you print is seen. Write it for the person who asked.
- To send no reply at all, make your final message exactly NO_REPLY
  and nothing else.
"""

CHECKOUTS_PROMPT = """\
The request, from dana:
> ship it

About this run (from the harness that started you, not from the sender):
- You have up to 45 minutes for this run; it is stopped after that.
  Plan the work to fit. If it cannot all be done in time, finish the most
  useful part and say plainly what is left.
- This conversation has git checkouts of its own (all in the folder
  $PROHOST_RUN_REPOS). Do all repository work in them and nowhere else;
  each stands in for the original named after it:
    app: /home/me/.prohost/worktrees/conv-C42/app
      (instead of /home/me/code/app)
      on its own branch prohost/conv-C42
  They are worktrees private to this conversation and they persist
  between its runs, so a branch or an uncommitted change you find in one
  is your own earlier work here. Each was put on its own branch, named
  above, made from the original's commit when the conversation began
  and never updated for you. Commit work that should last on it: the
  branch lives in the original repository, where the person can see,
  merge or push it. A branch checked out elsewhere (such as the
  original's) cannot be checked out here.
  Wherever your other instructions name an original as the place to
  work, use its private path above instead.
  You start in the first one, app: your working directory
  is its private path, not the original.
  Never switch branches, commit, or edit files in the originals: other
  runs read them. Do not run `git worktree add`, `remove`, `move` or
  `prune` yourself.
- No private checkout could be prepared for:
    /home/me/code/lib (not a git checkout)
  Treat those repositories as read-only for this run: do not switch
  branches, commit, or edit files in them, and say so if the request
  needed a change there.
- Your final message is the reply: it is sent exactly as you write it,
  and nothing else you print is seen. Write it for the person who asked.
- To send no reply at all, make your final message exactly NO_REPLY
  and nothing else.
"""


def test_full_prompt() -> None:
    context = PromptContext(timeout_s=7200, idle_timeout_s=900, parallel=True)
    assert build_prompt(FULL_RUN, context) == FULL_PROMPT


def test_bare_prompt_without_limits() -> None:
    context = PromptContext(timeout_s=0, idle_timeout_s=0, parallel=False)
    assert build_prompt(BARE_RUN, context) == BARE_PROMPT


def test_prompt_with_checkouts() -> None:
    run = AgentRun(run_id="run_03", completion_path="/c", text="ship it", author="dana")
    app = Checkout(
        name="app",
        path="/home/me/.prohost/worktrees/conv-C42/app",
        source="/home/me/code/app",
        branch="prohost/conv-C42",
    )
    context = PromptContext(
        timeout_s=2700,
        idle_timeout_s=0,
        parallel=False,
        checkouts=(app,),
        starts_in=app,
        checkout_failures=(
            CheckoutFailure(source="/home/me/code/lib", reason="not a git checkout"),
        ),
    )
    assert build_prompt(run, context) == CHECKOUTS_PROMPT


def test_idle_limit_only() -> None:
    context = PromptContext(timeout_s=0, idle_timeout_s=900, parallel=False)
    prompt = build_prompt(BARE_RUN, context)
    assert (
        "- This run has no overall time limit, but it is stopped if it prints\n"
        "  nothing for 15 minutes.\n"
    ) in prompt


def test_same_input_same_bytes() -> None:
    context = PromptContext(timeout_s=7200, idle_timeout_s=900, parallel=True)
    assert build_prompt(FULL_RUN, context) == build_prompt(FULL_RUN, context)


@pytest.mark.parametrize(
    ("text", "reply"),
    [
        ("  Fixed it.\n", "Fixed it."),
        ("NO_REPLY", None),
        ("\n  NO_REPLY \n", None),
        ("NO_REPLY, but here is why", "NO_REPLY, but here is why"),
        ("no_reply", "no_reply"),
        ("", ""),
    ],
)
def test_reply_from_text(text: str, reply: str | None) -> None:
    assert reply_from_text(text) == reply


def test_no_reply_token() -> None:
    assert NO_REPLY == "NO_REPLY"


def test_cap_reply_leaves_a_short_reply_alone() -> None:
    assert cap_reply("short") == "short"


def test_cap_reply_cuts_with_a_marker() -> None:
    reply = cap_reply("é" * MAX_REPLY_BYTES)  # 2 MiB of UTF-8
    assert reply.endswith("\n\n" + REPLY_CUT_MARKER)
    assert len(reply.encode("utf-8")) <= MAX_REPLY_BYTES
    assert reply.startswith("ééé")


def test_cap_reply_marks_text_cut_upstream() -> None:
    assert cap_reply("partial", cut=True) == "partial\n\n" + REPLY_CUT_MARKER


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, "no limit"),
        (-1, "no limit"),
        (0.5, "0.5 seconds"),
        (1, "1 second"),
        (45, "45 seconds"),
        (60, "1 minute"),
        (90, "90 seconds"),
        (120, "2 minutes"),
        (150, "2 minutes"),
        (900, "15 minutes"),
        (2700, "45 minutes"),
        (3600, "1 hour"),
        (5400, "90 minutes"),
        (7200, "2 hours"),
        (9000, "150 minutes"),
        (37800, "10.5 hours"),
        (86400, "24 hours"),
    ],
)
def test_human_duration(seconds: float, said: str) -> None:
    assert human_duration(seconds) == said


def test_an_agent_started_in_its_checkout_is_not_told_it_shares_its_folder() -> None:
    app = Checkout(name="app", path="/w/conv-C1/app", source="/code/app",
                   branch="prohost/conv-C1")
    shared = build_prompt(BARE_RUN, PromptContext(timeout_s=0, idle_timeout_s=0,
                                                  parallel=True, checkouts=(app,)))
    own = build_prompt(BARE_RUN, PromptContext(timeout_s=0, idle_timeout_s=0, parallel=True,
                                               checkouts=(app,), starts_in=app))
    assert "in this same working directory" in shared
    assert "You start in the first one" not in shared
    assert "in this same working directory" not in own
    assert "as other processes of you. Outside your private checkouts, give any" in own
    assert "You start in the first one, app: your working directory" in own


@pytest.mark.protocol("§13")
def test_a_confined_agent_is_told_where_it_may_write() -> None:
    app = Checkout(name="app", path="/p/worktrees/conv-C42/app", source="/code/app",
                   branch="prohost/conv-C42")
    plain = build_prompt(BARE_RUN, PromptContext(timeout_s=0, idle_timeout_s=0,
                                                  parallel=False, confined=True,
                                                  workdir="/p/workspace"))
    assert ("- You are confined: you can write only in\n"
            "  the working directory /p/workspace,\n"
            "  $TMPDIR (private to this run, removed after it), your CLI's own settings\n"
            ) in plain
    assert "$PROHOST_HOME and secrets such as ~/.ssh are hidden" in plain
    assert "the caches your tools are pointed at ($XDG_CACHE_HOME," in plain
    repos = build_prompt(BARE_RUN, PromptContext(timeout_s=0, idle_timeout_s=0,
                                                  parallel=False, confined=True,
                                                  workdir="/p/workspace", checkouts=(app,),
                                                  starts_in=app))
    assert "  your checkouts above (and their git data: you can commit on their\n" in repos
    assert "/p/workspace" not in repos  # with --repos, --workdir is no run's place
    unconfined = build_prompt(BARE_RUN, PromptContext(timeout_s=0, idle_timeout_s=0,
                                                      parallel=False, workdir="/p/w"))
    assert "confined" not in unconfined
