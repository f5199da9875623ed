"""What an ACP turn used, in §7's keys, agent by agent.

ACP v1 has two places for usage, both optional: the ``session/prompt`` response's
``usage`` (unstable: ``inputTokens``, ``outputTokens``, ``cachedReadTokens``,
``cachedWriteTokens``, ``thoughtTokens``), and ``usage_update`` notifications with
the session's running ``cost``. Each agent fills them its own way, read from each
agent's installed code and its real output against the mock model
(tests/harness/test_real_acp_agents.py); the README's table says the same:

* **Claude Code** (``@agentclientprotocol/claude-agent-acp``): the prompt
  response's ``usage`` is the turn's, every model call summed; ``input`` excludes
  the cache keys. Cost: ``usage_update.cost``, counted from the adapter's start.
* **Codex** (``codex-acp``): no tokens and no cost on the wire (its
  ``usage_update`` carries only the context window's ``used``/``size``): nothing.
* **Gemini CLI**: the prompt response's ``_meta.quota.token_count`` sums each model
  call's ``promptTokenCount`` (cached tokens included, not said apart) and
  ``candidatesTokenCount`` (thinking excluded, not said apart) (``GeminiAgent``
  prompt loop in @google/gemini-cli 0.61's bundle): neither is §7's figure, so
  neither is given.
* **Qwen Code**: each model call's ``usage`` in an ``agent_message_chunk``'s
  ``_meta.usage`` (``emitUsageMetadata`` in @qwen-code/qwen-code 0.15's
  ``cli.js``: ``inputTokens`` is the prompt with its cached part,
  ``outputTokens`` without ``thoughtTokens``), none in the prompt response: summed
  here, the cached part taken out of the input and the thinking put into the
  output. Its model id is ``$runtime|<auth type>|<model>(<auth type>)``.
* **OpenCode**: the prompt response's ``usage`` is the turn's *last* model call
  only (a turn with a tool call made two): given only for a turn without tool calls.
"""

from __future__ import annotations

import re
from typing import Any

from prohost.wire.usage import Usage, valid_count, valid_model

#: ``agentInfo.name`` of the agents read apart.
GEMINI = "gemini-cli"
OPENCODE = "OpenCode"

_QWEN_MODEL = re.compile(r"^\$runtime\|[^|]*\|(?P<model>.+?)(?:\([^()]*\))?$")


class TurnTokens:
    """The tokens of one turn, from wherever its agent says them."""

    def __init__(self) -> None:
        self.agent = ""
        #: The prompt response's figures (``None``: it gave none).
        self._answer: Usage | None = None
        #: Qwen Code's per-call figures, summed.
        self._calls: Usage | None = None
        #: A tool was called this turn (more than one model call).
        self.tool_called = False

    def call(self, meta: object) -> None:
        """An ``agent_message_chunk``'s ``_meta``: one model call's usage (Qwen)."""
        usage = meta.get("usage") if isinstance(meta, dict) else None
        if not isinstance(usage, dict):
            return
        cached = valid_count(usage.get("cachedReadTokens"))
        given = valid_count(usage.get("inputTokens"))
        output = valid_count(usage.get("outputTokens"))
        thought = valid_count(usage.get("thoughtTokens")) or 0
        one = Usage(
            input_tokens=given - cached if given is not None and cached is not None
            and cached <= given else given,
            output_tokens=output + thought if output is not None else None,
            cache_read_tokens=cached)
        self._calls = one if self._calls is None else self._calls + one

    def answer(self, usage: object, meta: object) -> None:
        """The ``session/prompt`` response's ``usage`` and ``_meta``."""
        if self.agent == GEMINI:
            return  # see the module's notes: not §7's figures
        if self.agent == OPENCODE and self.tool_called:
            return  # only the last model call's
        if isinstance(usage, dict):
            self._answer = Usage(
                input_tokens=valid_count(usage.get("inputTokens")),
                output_tokens=valid_count(usage.get("outputTokens")),
                cache_read_tokens=valid_count(usage.get("cachedReadTokens")),
                cache_write_tokens=valid_count(usage.get("cachedWriteTokens")))

    def usage(self) -> Usage:
        """What is known so far (a cancelled turn has its calls up to the cancel)."""
        if self._answer is not None:
            return self._answer
        return self._calls or Usage()


def model_name(value: object) -> str | None:
    """A model id as an agent gives it, as §7's ``model``: Qwen Code's
    ``$runtime|openai|mock-model(openai)`` is ``mock-model``."""
    model = valid_model(value)
    if model is None:
        return None
    qwen = _QWEN_MODEL.match(model)
    return valid_model(qwen.group("model")) if qwen is not None else model


def session_model(answer: dict[str, Any]) -> str | None:
    """The model a session setup response names: ``models.currentModelId`` (an
    unstable part of v1 that Gemini CLI and Qwen Code send), else the current value
    of the ``model`` config option (``configOptions``, v1: OpenCode, and the Claude
    Code adapter, whose value ``default`` is named by its description)."""
    models = answer.get("models")
    if isinstance(models, dict):
        named = model_name(models.get("currentModelId"))
        if named is not None:
            return named
    options = answer.get("configOptions")
    for option in options if isinstance(options, list) else []:
        if isinstance(option, dict) and option.get("category") == "model":
            value = model_name(option.get("currentValue"))
            if value is not None and value != "default":
                return value
            if value == "default":
                return _default_named(option)
    return None


#: "Use the default model (currently Opus 4.8 (1M context)) · $5/$25 per Mtok": the
#: Claude Code adapter's description of its ``default`` model choice (0.49).
_CURRENTLY = re.compile(r"\(currently ((?:[^()]|\([^()]*\))+)\)")


def _default_named(option: dict[str, Any]) -> str | None:
    """The model behind a ``default`` choice, as its description names it."""
    for entry in option.get("options") or []:
        if isinstance(entry, dict) and entry.get("value") == "default":
            found = _CURRENTLY.search(str(entry.get("description") or ""))
            return valid_model(found.group(1)) if found is not None else None
    return None
