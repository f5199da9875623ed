"""Logging an ACP agent in with a key from its environment.

An agent that answers a session setup with -32000 "Authentication required" may
advertise, in ``initialize``'s ``authMethods``, methods of ``type`` ``env_var``
(ACP ``AuthMethodEnvVar``: the ``vars`` it reads): codex-acp 0.16 offers
"codex-api-key" (``CODEX_API_KEY``) and "openai-api-key" (``OPENAI_API_KEY``) and
reads neither until told to by ``authenticate`` (seen against the real agent: it
then writes the key into its ``CODEX_HOME/auth.json``, as ``codex login
--with-api-key`` does). The brain authenticates with the first such method its
environment satisfies, as acpx's ``authenticateIfRequired`` does, and otherwise
names the variables in the error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Auth methods of agents that take a key from their environment without saying
#: so with an ``env_var`` method: Gemini CLI's "gemini-api-key" reads
#: ``GEMINI_API_KEY`` (``GeminiAgent.authenticate`` in @google/gemini-cli 0.61's
#: bundle, ``refreshAuth(USE_GEMINI)``), and a session/load it answers -32000
#: without a saved auth type: authenticating first takes the session back.
KNOWN_KEY_METHODS: dict[str, tuple[str, ...]] = {"gemini-api-key": ("GEMINI_API_KEY",)}


def key_methods(auth_methods: list[dict[str, Any]]) -> list[tuple[str, tuple[str, ...]]]:
    """The agent's auth methods that take keys from its environment, each with the
    variables it needs (``vars`` not marked ``optional``)."""
    found = []
    for method in auth_methods:
        method_id = method.get("id")
        if not isinstance(method_id, str):
            continue
        if method.get("type") == "env_var" and isinstance(method.get("vars"), list):
            names = tuple(v["name"] for v in method["vars"] if isinstance(v, dict)
                          and isinstance(v.get("name"), str) and not v.get("optional"))
            found.append((method_id, names))
        elif method_id in KNOWN_KEY_METHODS:
            found.append((method_id, KNOWN_KEY_METHODS[method_id]))
    return found


def method_for(auth_methods: list[dict[str, Any]], env: Mapping[str, str]) -> str | None:
    """The first method whose every variable ``env`` sets (non-empty), or ``None``."""
    for method_id, names in key_methods(auth_methods):
        if names and all(env.get(name) for name in names):
            return method_id
    return None


def key_names(auth_methods: list[dict[str, Any]]) -> list[str]:
    """Every variable the agent could be logged in with, for the error."""
    return [name for _, names in key_methods(auth_methods) for name in names]
