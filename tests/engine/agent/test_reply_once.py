"""A reply is said once, by its brain (issue 26): trimmed, ``None`` for ``NO_REPLY``
and capped in :func:`prohost.engine.agent.reply.final_reply`, which the Runner
passes on as it is (through the production Runner's middle, tests/kits/runner.py).
The plain brain used to cap its stdout and the runner cap the result again."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import trio

from prohost.engine.agent import reply as replies
from prohost.engine.agent.brains.claude import ClaudeTurn
from prohost.engine.agent.brains.plain import PlainBrain
from prohost.engine.agent.process import ProcessGroups, ProcessResult
from prohost.engine.agent.reply import MAX_REPLY_BYTES, REPLY_CUT_MARKER, final_reply
from prohost.engine.run.execute import ExecSpec
from prohost.wire.runs import AgentRun
from tests.kits.paths import AGENTS
from tests.kits.runner import solo_runner

pytestmark = pytest.mark.protocol("§5")

RUN = AgentRun(run_id="run_once", completion_path="/c", text="hello")


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every reply :func:`cap_reply` is asked to cap, in order."""
    seen: list[str] = []
    cap = replies.cap_reply

    def counting(reply: str, *, cut: bool = False) -> str:
        seen.append(reply)
        return cap(reply, cut=cut)

    monkeypatch.setattr(replies, "cap_reply", counting)
    return seen


@pytest.mark.parametrize("agent", [["reply.py", "  the answer \n"], ["flood.py", "50"]])
async def test_the_plain_brains_reply_is_capped_once(
    tmp_path: Path, capped: list[str], agent: list[str]
) -> None:
    groups = ProcessGroups()
    groups.grace_s = 0.2
    name, *args = agent
    command = shlex.join([sys.executable, str(AGENTS / name), *args])
    spec = ExecSpec(command=command, workdir=tmp_path, timeout_s=0.0, idle_timeout_s=0.0,
                    parallel=False, secrets=())
    with trio.fail_after(15):
        async with solo_runner(tmp_path / "solo", spec, PlainBrain(command),
                               groups=groups) as solo:
            outcome = await solo.outcome(RUN)
    assert outcome.ok and outcome.reply is not None
    assert len(capped) == 1
    if name == "flood.py":  # 50 MiB printed: cut once, marked once
        assert outcome.reply.count(REPLY_CUT_MARKER) == 1
        assert len(outcome.reply.encode("utf-8")) <= MAX_REPLY_BYTES
    else:
        assert outcome.reply == "the answer"


def test_a_streaming_brain_says_no_reply_itself() -> None:
    turn = ClaudeTurn()
    for event in ({"type": "system", "subtype": "init", "session_id": "s1"},
                  {"type": "result", "subtype": "success", "is_error": False,
                   "session_id": "s1", "result": "  NO_REPLY \n"}):
        turn.feed(json.dumps(event).encode())
    outcome = turn.finish(ProcessResult(
        exit_code=0, signal=None, stdout=b"", stdout_truncated=False, last_stderr_line="",
        timed_out=None, duration_s=0.1, overlong_lines=0))
    assert outcome is not None and outcome.ok and outcome.reply is None


def test_text_cut_upstream_is_never_no_reply() -> None:
    assert final_reply("NO_REPLY", cut=True) == "NO_REPLY\n\n" + REPLY_CUT_MARKER
    assert final_reply(" NO_REPLY ") is None
    assert final_reply(" kept ") == "kept"
