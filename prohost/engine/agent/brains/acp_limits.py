"""Usage-limit texts of agents spoken to over ACP, read into a
:class:`~prohost.engine.accounts.limits.LimitNotice` (§12).

ACP has no message for "your account is at its limit": an agent says it in the
error of the ``session/prompt`` (or ``session/new``) response, or on stderr before
it dies. So the texts are recognised here, one agent family at a time, each with
where it comes from (also the table in the README):

* Gemini CLI (and Qwen Code, its fork) — ``TerminalQuotaError``:
  ``You have exhausted your capacity on this model. Your quota will reset after
  2h36m24s.`` (``googleQuotaErrors.js`` in ``@google/gemini-cli-core``, as quoted in
  ai-supervisor-foundry/foundry ``geminiStub/default.ts``); the reset is read.
* Gemini API quota — HTTP 429 ``RESOURCE_EXHAUSTED`` with ``Resource has been
  exhausted (e.g. check quota).`` (google-gemini/gemini-cli issues 1848, 1905,
  19976) and ``You exceeded your current quota`` (Gemini API and OpenAI-compatible
  ``insufficient_quota`` 429s): limited, no reset given. A 429 for the *server's*
  capacity (``MODEL_CAPACITY_EXHAUSTED``, ``No capacity available for model``) is
  not the account's limit and is not read as one.
* Claude Code through ``claude-code-acp``/``claude-agent-acp`` and Codex through
  ``codex-acp`` pass their CLI's own texts on: read as the claude and codex brains
  read them (:mod:`prohost.engine.agent.limits`).
"""

from __future__ import annotations

import re

from prohost.engine.accounts.limits import LimitNotice
from prohost.engine.agent.limits import claude_limit_text, codex_limit_text

_GEMINI_TERMINAL = re.compile(
    r"exhausted your capacity on this model|quota will reset after", re.IGNORECASE)
_GEMINI_AFTER = re.compile(
    r"reset after\s+(?:(?P<h>\d+)h)?\s*(?:(?P<m>\d+)m)?\s*(?:(?P<s>\d+)s)?", re.IGNORECASE)
_QUOTA = re.compile(
    r"resource has been exhausted \(e\.g\. check quota\)|you exceeded your current quota"
    r"|RESOURCE_EXHAUSTED.{0,400}quota|quota.{0,400}RESOURCE_EXHAUSTED",
    re.IGNORECASE | re.DOTALL)
_CAPACITY = re.compile(r"MODEL_CAPACITY_EXHAUSTED|no capacity available for model",
                       re.IGNORECASE)


def acp_limit_text(text: str, now: float) -> LimitNotice | None:
    """A ``limited`` notice when ``text`` (an agent's error) says its account's usage
    limit is reached, else ``None``."""
    if not text or _CAPACITY.search(text):
        return None
    if _GEMINI_TERMINAL.search(text):
        after = _GEMINI_AFTER.search(text)
        resets = None
        if after is not None and any(after.group(key) for key in "hms"):
            seconds = sum(int(after.group(key) or 0) * unit
                          for key, unit in (("h", 3600), ("m", 60), ("s", 1)))
            resets = now + seconds
        return LimitNotice(state="limited", resets_at=resets, source="gemini quota exhausted")
    if _QUOTA.search(text):
        return LimitNotice(state="limited", source="quota exceeded (HTTP 429)")
    return claude_limit_text(text, now, anywhere=True) or codex_limit_text(text, now)
