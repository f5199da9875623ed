"""What prohost chooses among what an ACP agent offers: the option that answers a
permission request, and the model and mode a session is given once it is open
(``--acp-model``, ``--acp-mode``; with ``--safe-tools``, the agent's asking mode).

ACP v1 offers two ways, and agents use either (read from their session setup
answers against the mock model, tests/harness/test_real_acp_agents.py):

* ``configOptions`` (v1): options of ``category`` ``model`` or ``mode``, each set
  with ``session/set_config_option {sessionId, configId, value}`` (OpenCode's
  model, the Claude Code adapter's model);
* ``models`` / ``modes`` (``session/set_model {modelId}``, unstable, and
  ``session/set_mode {modeId}``): Gemini CLI, Qwen Code, codex-acp, and the Claude
  Code adapter's modes.

A value the agent does not offer is refused before anything is sent, naming what
it offers; a model is matched by its id or by its name as §7 reports it (Qwen's
``$runtime|openai|mock-model(openai)`` is ``mock-model``).
"""

from __future__ import annotations

from typing import Any

from prohost.engine.agent.brains.acp_usage import model_name

#: The methods that set a choice, and what they set (for the error that refuses it).
SETTERS = {"session/set_config_option": "the option", "session/set_model": "the model",
           "session/set_mode": "the mode"}

#: Modes in which an agent asks before a tool acts, best first: "default" (the
#: Claude Code adapter: "prompts for dangerous operations"; Gemini CLI and Qwen
#: Code: "Prompts for approval"), "read-only" (codex-acp: "Approval is required to
#: edit files or access the internet").
ASKING_MODES = ("default", "read-only")


_ALLOW = ("allow_once", "allow_always")
_REJECT = ("reject_once", "reject_always")

#: Reject options known to end the agent's turn when chosen: codex-acp's "abort"
#: (``ReviewDecision::Abort``, "No, and tell Codex what to do differently") and
#: "timed_out" (zed-industries/codex-acp ``src/thread.rs``, the exec and patch
#: approval options). ``--safe-tools`` picks them only when nothing else refuses.
_ENDS_TURN = frozenset({"abort", "timed_out"})


def permission_option(options: list[Any], *, safe_tools: bool) -> tuple[str | None, bool]:
    """The option to answer a permission request with, and whether it is known to
    end the turn: the agent's allow option (``allow_once`` before ``allow_always``,
    which could write a lasting rule into its settings); with ``safe_tools`` a
    refusal, ``reject_once`` before ``reject_always``, and either before a refusal
    that ends the turn. ``None``: no option fits (the request is then cancelled)."""
    offered = [(o.get("kind"), o["optionId"]) for o in options
               if isinstance(o, dict) and isinstance(o.get("optionId"), str)]
    if safe_tools:
        ranked = sorted(((option_id in _ENDS_TURN, _REJECT.index(str(kind)), option_id)
                         for kind, option_id in offered if kind in _REJECT))
        return (ranked[0][2], ranked[0][0]) if ranked else (None, False)
    for kind in _ALLOW:
        for offered_kind, option_id in offered:
            if offered_kind == kind:
                return option_id, False
    return None, False


class ChoiceError(ValueError):
    """A model or mode the agent does not offer."""


def choices(answer: dict[str, Any], session: str, *, model: str | None, mode: str | None,
            safe_tools: bool) -> list[tuple[str, dict[str, Any]]]:
    """The requests that give the session ``model`` and ``mode`` (``None``: as the
    agent has it; with ``safe_tools``, ``mode`` defaults to an asking mode), in
    order; only what differs from the session's current choice."""
    sent: list[tuple[str, dict[str, Any]]] = []
    if model is not None:
        sent += _choose(answer, session, "model", model, "models", "availableModels",
                        "modelId", "currentModelId", "session/set_model")
    if mode is None and safe_tools:
        offered = _offered(answer, "mode", "modes", "availableModes", "id")
        mode = next((m for m in ASKING_MODES if m in offered), None)
    if mode is not None:
        sent += _choose(answer, session, "mode", mode, "modes", "availableModes", "id",
                        "currentModeId", "session/set_mode")
    return sent


def _option(answer: dict[str, Any], category: str) -> dict[str, Any] | None:
    options = answer.get("configOptions")
    for option in options if isinstance(options, list) else []:
        if isinstance(option, dict) and option.get("category") == category and isinstance(
                option.get("id"), str):
            return option
    return None


def _values(option: dict[str, Any]) -> list[str]:
    """A select option's values (ACP allows them in groups: ``{group, options}``)."""
    found: list[str] = []
    for entry in option.get("options") or []:
        if isinstance(entry, dict) and isinstance(entry.get("value"), str):
            found.append(entry["value"])
        elif isinstance(entry, dict) and isinstance(entry.get("options"), list):
            found += _values(entry)
    return found


def _offered(answer: dict[str, Any], category: str, legacy: str, listed: str,
             key: str) -> list[str]:
    option = _option(answer, category)
    if option is not None:
        return _values(option)
    state = answer.get(legacy)
    entries = state.get(listed) if isinstance(state, dict) else None
    return [e[key] for e in entries or [] if isinstance(e, dict) and isinstance(e.get(key), str)]


def _choose(answer: dict[str, Any], session: str, category: str, wanted: str, legacy: str,
            listed: str, key: str, current_key: str,
            setter: str) -> list[tuple[str, dict[str, Any]]]:
    offered = _offered(answer, category, legacy, listed, key)
    if not offered:
        raise ChoiceError(f"the agent offers no way to choose its {category} "
                          f"(--acp-{category} {wanted})")
    value = next((v for v in offered if v == wanted), None) or next(
        (v for v in offered if model_name(v) == wanted), None)
    if value is None:
        shown = ", ".join(model_name(v) or v for v in offered[:30])
        raise ChoiceError(f"the agent offers no {category} {wanted!r} (--acp-{category}); "
                          f"it offers: {shown}")
    option = _option(answer, category)
    if option is not None:
        if option.get("currentValue") == value:
            return []
        return [("session/set_config_option",
                 {"sessionId": session, "configId": option["id"], "value": value})]
    state = answer.get(legacy)
    if isinstance(state, dict) and state.get(current_key) == value:
        return []
    return [(setter, {"sessionId": session, key if key != "id" else "modeId": value})]


def chosen(params: dict[str, Any], model: str | None,
           mode: str | None) -> tuple[str | None, str | None]:
    """The session's model and mode once the agent accepted ``params``."""
    if "modelId" in params:
        return model_name(params["modelId"]) or model, mode
    if "modeId" in params:
        return model, str(params["modeId"])
    # A config option: which category is not in the request; its value says enough.
    value = params.get("value")
    if isinstance(value, str) and params.get("configId") in ("model", "mode"):
        return (model_name(value) or model, mode) if params["configId"] == "model" else (
            model, value)
    return model, mode


def chosen_value(params: dict[str, Any]) -> object:
    return params.get("modelId") or params.get("modeId") or params.get("value")


def session_mode(answer: dict[str, Any]) -> str | None:
    """The session's current mode, from a setup answer."""
    option = _option(answer, "mode")
    if option is not None and isinstance(option.get("currentValue"), str):
        return str(option["currentValue"])
    modes = answer.get("modes")
    current = modes.get("currentModeId") if isinstance(modes, dict) else None
    return current if isinstance(current, str) else None
