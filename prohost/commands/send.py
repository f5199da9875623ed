"""``prohost send``: submit a request to a reference server (PROTOCOL.md §11).

Prints the new run's id; with ``wait``, polls the run until it ends and prints its
reply (``(no reply)`` when the agent chose not to answer). Every failure is one
line on stderr and exit status 1.
"""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from prohost.engine.view.reporttext import changes_lines, file_lines, files_line, usage_line

#: Run states after which nothing changes (§11).
TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "closed"})
POLL_FIRST_S = 0.2
POLL_MAX_S = 2.0


class SendError(Exception):
    """A one-line reason why ``prohost send`` failed."""


def api_base(server: str) -> str:
    """``http(s)://host:port`` from a server address: an HTTP or WebSocket URL (its
    path dropped, ``ws`` → ``http``), or a bare ``host:port``."""
    text = server.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.netloc:
        raise SendError(f"{server!r} is not a server address (expected http://host:port)")
    return f"{scheme}://{parts.netloc}"


def _answer(response: httpx.Response, what: str) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = None
    if not response.is_success:
        detail = data.get("error") if isinstance(data, dict) else None
        detail = detail or response.text.strip()[:200] or response.reason_phrase
        raise SendError(f"{what}: the server answered {response.status_code}: {detail}")
    if not isinstance(data, dict):
        raise SendError(f"{what}: the server's answer is not a JSON object")
    return data


async def _wait_for_end(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    delay = POLL_FIRST_S
    while True:
        run = _answer(await client.get(f"/v1/runs/{run_id}"), f"reading run {run_id}")
        if run.get("state") in TERMINAL_STATES:
            return run
        await trio.sleep(delay)
        delay = min(POLL_MAX_S, delay * 1.5)


async def _send(
    base: str, text: str, conversation: str | None, wait: bool, timeout_s: float
) -> int:
    async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
        created = _answer(
            await client.post("/v1/runs", json={"conversation_id": conversation, "text": text}),
            "submitting the request",
        )
        run_id = created.get("run_id")
        if not isinstance(run_id, str):
            raise SendError("the server's answer has no run_id")
        print(run_id, flush=True)
        if not wait:
            return 0
        run: dict[str, Any] | None = None
        with trio.move_on_after(timeout_s):
            run = await _wait_for_end(client, run_id)
        if run is None:
            raise SendError(f"run {run_id} did not finish within {timeout_s:g} s")
    state = run.get("state")
    if state == "completed":
        reply = run.get("reply")
        print("(no reply)" if reply is None else reply, flush=True)
    else:
        error = run.get("error") or f"the run was {state}"
        print(f"prohost send: run {run_id} {state}: {error}", file=sys.stderr, flush=True)
    for line in what_the_run_did(run):
        print(line, flush=True)
    return 0 if state == "completed" else 1


def what_the_run_did(run: dict[str, Any]) -> list[str]:
    """The lines after the reply: each checkout's changes (with its files) and the
    run's usage (§7), as the server's runs API returns them; none when the report
    carried neither."""
    changes, usage = run.get("changes"), usage_line(run.get("usage"))
    lines: list[str] = []
    if changes_lines(changes):
        lines.append("changes:")
        for entry in changes if isinstance(changes, list) else []:
            if isinstance(entry, dict):
                lines.append(f"  {files_line(entry)}")
                lines.extend(f"    {line}" for line in file_lines(entry))
    if usage is not None:
        lines.append(f"usage: {usage}")
    return ["", *lines] if lines else []


async def send_command(
    server: str, text: str, conversation: str | None, wait: bool, timeout_s: float = 600
) -> int:
    """Submit ``text`` (in ``conversation``) to ``server``; see the module docstring.

    Cancelled (Ctrl-C): the request or the polling stops; a run already submitted
    stays on the server and goes on there.
    """
    try:
        base = api_base(server)
        return await _send(base, text, conversation, wait, timeout_s)
    except SendError as exc:
        message = str(exc)
    except httpx.TransportError as exc:
        message = f"cannot reach the server at {server}: {str(exc) or type(exc).__name__}"
    except httpx.HTTPError as exc:
        message = f"request to {server} failed: {str(exc) or type(exc).__name__}"
    print(f"prohost send: {message}", file=sys.stderr, flush=True)
    return 1
