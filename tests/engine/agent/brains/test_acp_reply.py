"""An ACP turn's reply read from its chunks (prohost/engine/agent/brains/acp_reply.py):
where an agent that names no message (codex-acp) leads with a message of its own."""

from __future__ import annotations

import pytest

from prohost.engine.agent.brains.acp_reply import ReplyText

WARNING = "Codex could not load its plugins; it goes on without them."


def reply_of(*chunks: str) -> str:
    reply = ReplyText()
    for chunk in chunks:
        reply.add(chunk, None)
    return reply.text()


def test_unknown_leading_messages_each_stand_apart_from_the_answer() -> None:
    second = "Falling back to the slow path for this turn."
    assert reply_of(WARNING, second, "Hello ", "from the mock.") == (
        f"{WARNING}\n\n{second}\n\nHello from the mock.")


@pytest.mark.parametrize("chunks", [
    ("Hello ", "from the ", "mock.", "Then", " more."),  # a streamed answer
    ("Sure.", "Here it is."),  # a short first chunk is a stream's, not a message
    ("The version you asked for is 2.", "5 came later."),  # no new sentence starts
    ("We are done with the files.", " And then"),  # a space: the agent's own join
])
def test_a_streamed_answer_is_joined_as_it_came(chunks: tuple[str, ...]) -> None:
    assert reply_of(*chunks) == "".join(chunks)


def test_named_messages_are_not_read_as_leading_ones() -> None:
    reply = ReplyText()
    reply.add("We are done with the files.", "m1")
    reply.add("Next", "m1")
    assert reply.text() == "We are done with the files.Next"
