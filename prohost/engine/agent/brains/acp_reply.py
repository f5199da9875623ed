"""An ACP turn's reply: its ``agent_message_chunk`` texts, and what is not the reply.

ACP streams the agent's words as ``agent_message_chunk`` updates
(agentclientprotocol/agent-client-protocol ``schema/v1/schema.json``,
``ContentChunk``), each optionally with a ``messageId`` naming the message it
belongs to. The reply is the turn's messages in order, a paragraph each (and a
new paragraph after a tool call), cut at :data:`MAX_REPLY_BYTES`.

Not every chunk is the agent's answer to the person:

* An agent that names its messages (the Claude Code adapter, OpenCode) sends its
  answer with a ``messageId``: a chunk without one among them is a notice of the
  agent's own, not a message of the answer.
* codex-acp names none, and forwards Codex's warnings as whole chunks
  (``EventMsg::Warning`` → ``send_agent_text`` in zed-industries/codex-acp
  ``src/thread.rs``): "Model metadata for `mock-model` not found. Defaulting to
  fallback metadata…", "Under-development features enabled…", "Falling back from
  WebSockets to HTTPS transport…" (each seen from the real agent). Nothing in the
  message tells a warning from the answer: both are ``send_agent_text``, an
  ``agent_message_chunk`` with a text and no ``messageId`` or ``_meta`` (codex-acp
  0.13's source, 0.16's binary), and on the wire the warning comes right before
  the answer's first chunk, nothing between. So the known ones are known by their
  words (:data:`_CODEX_WARNINGS`). One Codex adds later is not: it stays in the
  reply, but as a paragraph of its own rather than glued to the answer's first
  word ("…issues.Hello"): at the start of the turn, a chunk that is a whole
  sentence (:func:`_whole`) followed, with no space, by one that starts a new
  sentence is taken for a message before the answer (a warning, or the answer's
  own first sentence: either way nothing is lost).

Notices go to the log and the timeline (§8), never to the reply.
"""

from __future__ import annotations

import re

from prohost.engine.agent.reply import MAX_REPLY_BYTES

#: Codex's warnings as codex-acp forwards them (each a chunk of its own; the
#: texts are Codex core's, as in the codex-acp 0.16 binary).
_CODEX_WARNINGS = re.compile(
    r"^\s*(Model metadata for `[^`]*` not found\. Defaulting to fallback metadata"
    r"|Under-development features enabled:"
    r"|Falling back from WebSockets to HTTPS transport\.)")


def _whole(text: str) -> bool:
    """A chunk that reads as a whole message: several words, ending a sentence with
    nothing after (a streamed answer's chunks are a few words each)."""
    return text.endswith((".", "!", "?")) and len(text.split()) >= _WHOLE_WORDS


#: How many words a chunk has at least to be taken for a whole message.
_WHOLE_WORDS = 4


class ReplyText:
    """The turn's message chunks, read into the reply and the notices."""

    def __init__(self) -> None:
        #: (named by a messageId, text) in order; the text carries its paragraph break.
        self._parts: list[tuple[bool, str]] = []
        self._bytes = 0
        self.cut = False
        self._paragraph = False
        self._message_id: object = None
        #: Some chunk named its message: the agent names its answer's messages.
        self._named = False
        #: Notices read from whole chunks (Codex's warnings), not yet told.
        self.notices: list[str] = []
        #: Every chunk so far read as a whole message (:func:`_whole`).
        self._leading = True

    def paragraph(self) -> None:
        """What comes next is a new paragraph (text after a tool call)."""
        self._paragraph = True

    def add(self, text: str, message_id: object) -> None:
        if not text:
            return
        if message_id is None and _CODEX_WARNINGS.search(text):
            self.notices.append(text.strip())
            return
        if (message_id is None and not self._named and self._leading and self._parts
                and (text[:1].isupper() or text[:1] in "#`*>")):
            # codex-acp sends an unlisted warning and the answer with no word
            # between: keep them apart (see the module's notes).
            self._paragraph = True
        self._leading = self._leading and _whole(text)
        if message_id is not None:
            self._named = True
            if message_id != self._message_id:
                # A new message of the turn: a paragraph of its own.
                if self._message_id is not None:
                    self._paragraph = True
                self._message_id = message_id
        if self._paragraph and self._parts and not self._parts[-1][1].endswith("\n\n"):
            text = "\n\n" + text
        self._paragraph = False
        if self.cut:
            return
        size = len(text.encode("utf-8", errors="replace"))
        if self._bytes + size > MAX_REPLY_BYTES:
            # Memory stays bounded whatever the agent says; the reply is cut anyway.
            text = text.encode("utf-8", errors="replace")[
                : MAX_REPLY_BYTES - self._bytes].decode("utf-8", errors="ignore")
            self.cut = True
        self._parts.append((message_id is not None, text))
        self._bytes += size

    def loose(self) -> list[str]:
        """Chunks without a ``messageId`` from an agent that names its messages:
        its own notices, not the reply."""
        if not self._named:
            return []
        return [text.strip() for named, text in self._parts if not named and text.strip()]

    def text(self) -> str:
        """The reply's text (before :func:`~prohost.engine.agent.reply.final_reply`)."""
        if self._named:
            return "".join(text for named, text in self._parts if named)
        return "".join(text for _, text in self._parts)
