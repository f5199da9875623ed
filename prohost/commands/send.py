"""``prohost send``: submit a request to a reference server (docs/protocol.md §11).

Prints the new run's id; with ``wait``, polls the run until it ends and prints its
reply (``(no reply)`` when the agent chose not to answer). A run the server retries
(a retryable failure, submitted again as a new run) is followed to its end.

Submitting needs the server's API token (:mod:`prohost.server.apitoken`), read
from the server's state folder: ``--state DIR``, else ``$PROHOST_HOME/server``
(where ``prohost server`` keeps it by default).

While the run waits for a harness and none is connected, it says so (a person
would otherwise wait in silence forever) and keeps waiting: that a harness was
connected N s ago and is expected back (the server restarted, say, and its
harnesses dial again), or that none is and one must be started. With
``fail_without_harness`` it gives up instead when none is expected (exit 3, the run
left queued). Ctrl-C says the run goes on at the server (exit 130). Every other
failure is one line on stderr and exit status 1.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from prohost.engine.view.reporttext import changes_lines, file_lines, files_line, usage_line
from prohost.home import prohost_home
from prohost.invocation import command
from prohost.server.apitoken import TokenError, read_token

#: Run states after which nothing changes (§11).
TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "closed"})
POLL_FIRST_S = 0.2
POLL_MAX_S = 2.0
EXIT_NO_HARNESS = 3
EXIT_INTERRUPTED = 130


class SendError(Exception):
    """A one-line reason why ``prohost send`` failed."""


class NoHarness(Exception):
    """``--fail-without-harness``: the run waits and no harness is connected."""


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


def server_state_dir(state: str | None) -> Path:
    """The server's state folder: ``state`` (``--state``), else the one ``prohost
    server`` uses by default, ``$PROHOST_HOME/server``."""
    if state is not None and state.strip():
        return Path(os.path.expanduser(state.strip())).absolute()
    return prohost_home(os.environ, Path.cwd()) / "server"


def api_headers(state: str | None) -> dict[str, str]:
    """The header that carries the server's API token, read from its state folder.
    Raises :class:`SendError` saying where it looked and what to do."""
    try:
        token = read_token(server_state_dir(state))
    except TokenError as exc:
        raise SendError(str(exc)) from None
    return {"Authorization": f"Bearer {token}"}


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


def _say(line: str) -> None:
    print(f"prohost send: {line}", file=sys.stderr, flush=True)


async def _harnesses(client: httpx.AsyncClient) -> tuple[int | None, list[dict[str, Any]]]:
    """How many harnesses the server has now (None: a server without ``/v1/status``),
    and those it expects back (``machine``, ``seen_s_ago``), most recent first."""
    answer = await client.get("/v1/status")
    if not answer.is_success:
        return None, []
    data = answer.json()
    if not isinstance(data, dict):
        return None, []
    count = data.get("connected")
    back = data.get("expected_back")
    expected = [entry for entry in back if isinstance(entry, dict)] if isinstance(
        back, list) else []
    return (count if isinstance(count, int) else None), expected


def _expected_line(run_id: str, expected: list[dict[str, Any]]) -> str:
    first = expected[0]
    ago = first.get("seen_s_ago")
    when = f"{ago:.0f} s ago" if isinstance(ago, (int, float)) else "recently"
    others = f" (and {len(expected) - 1} more)" if len(expected) > 1 else ""
    return (f"no harness is connected to the server right now, but {first.get('machine')}"
            f"{others} was connected {when} and is expected back (a harness dials again "
            f"on its own, at most 30 s apart, after the server restarts or the network "
            f"drops): run {run_id} waits for it (Ctrl-C stops waiting; the run stays on "
            "the server)")


async def _wait_for_end(
    client: httpx.AsyncClient, following: list[str], fail_without_harness: bool
) -> dict[str, Any]:
    """Poll the last run of ``following`` until it ends; a retry the server made of
    it is appended and followed. Cancelled: stops polling; nothing changes."""
    delay = POLL_FIRST_S
    told: str | None = None  # what was said of the harnesses: "expected", "none"
    while True:
        run_id = following[-1]
        run = _answer(await client.get(f"/v1/runs/{run_id}"), f"reading run {run_id}")
        state = run.get("state")
        retry = run.get("retried_as")
        if state in TERMINAL_STATES and isinstance(retry, str):
            _say(f"run {run_id} failed ({run.get('error')}); the server retries it as "
                 f"{retry}; waiting for that")
            following.append(retry)
            continue
        if state in TERMINAL_STATES:
            return run
        if state == "queued":
            connected, expected = await _harnesses(client)
            if connected == 0 and expected and told != "expected":
                told = "expected"
                _say(_expected_line(run_id, expected))
            elif connected == 0 and not expected:
                if fail_without_harness:
                    raise NoHarness(run_id)
                if told != "none":
                    told = "none"
                    _say(f"no harness is connected to the server: run {run_id} waits there "
                         f"until one connects (start one with `{command('agent', 'run')}`);"
                         " still waiting (Ctrl-C stops waiting; the run stays on the server)")
            elif connected and told is not None:
                told = None
                _say("a harness connected; waiting for the run")
        await trio.sleep(delay)
        delay = min(POLL_MAX_S, delay * 1.5)


async def _wait_unless_interrupted(
    client: httpx.AsyncClient, following: list[str], fail_without_harness: bool,
    timeout_s: float,
) -> tuple[dict[str, Any] | None, bool]:
    """:func:`_wait_for_end` within ``timeout_s`` (``None``: not ended by then), and
    whether Ctrl-C (SIGINT) stopped the wait first. The signal is received as a
    message (trio's signal receiver), not as a ``KeyboardInterrupt`` that could land
    anywhere: the wait is cancelled and nothing else is. Raises :class:`NoHarness`.
    Cancelled: stops waiting; nothing changes."""
    run: dict[str, Any] | None = None
    interrupted = False
    no_harness: NoHarness | None = None
    with trio.open_signal_receiver(signal.SIGINT) as sigint:
        async with trio.open_nursery() as nursery:

            async def stop_at_ctrl_c() -> None:
                nonlocal interrupted
                async for _ in sigint:
                    interrupted = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_at_ctrl_c)
            try:
                with trio.move_on_after(timeout_s):
                    run = await _wait_for_end(client, following, fail_without_harness)
            except NoHarness as exc:
                no_harness = exc
            nursery.cancel_scope.cancel()
    if no_harness is not None and not interrupted:
        raise no_harness
    return run, interrupted


async def _send(
    base: str, text: str, conversation: str | None, wait: bool, timeout_s: float,
    fail_without_harness: bool = False, server_state: str | None = None,
) -> int:
    headers = api_headers(server_state)
    async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
        created = _answer(
            await client.post("/v1/runs", json={"conversation_id": conversation, "text": text},
                              headers=headers),
            "submitting the request",
        )
        run_id = created.get("run_id")
        if not isinstance(run_id, str):
            raise SendError("the server's answer has no run_id")
        print(run_id, flush=True)
        if not wait:
            return 0
        following = [run_id]
        no_harness = False
        try:
            run, interrupted = await _wait_unless_interrupted(
                client, following, fail_without_harness, timeout_s)
        except NoHarness:
            run, interrupted, no_harness = None, False, True
        last = following[-1]
        where = ["--server", base] + (["--state", str(server_state_dir(server_state))]
                                      if server_state is not None else [])
        show = command("runs", "show", "--server", base, last)
        cancel = command("runs", "cancel", *where, last)
        if no_harness:
            _say(f"no harness is connected to the server, so run {last} cannot start; it "
                 f"stays queued there and runs when one connects (`{cancel}` drops it; "
                 f"`{command('agent', 'run')}` starts a harness)")
            return EXIT_NO_HARNESS
        if interrupted:
            _say(f"stopped waiting; run {last} goes on at the server (`{show}` to look, "
                 f"`{cancel}` to stop it)")
            return EXIT_INTERRUPTED
        if run is None:
            raise SendError(f"run {last} did not finish within {timeout_s:g} s; it "
                            f"goes on at the server (`{show}`)")
        run_id = following[-1]
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
    server: str, text: str, conversation: str | None, wait: bool, timeout_s: float = 600,
    fail_without_harness: bool = False, server_state: str | None = None,
) -> int:
    """Submit ``text`` (in ``conversation``) to ``server``, with the API token from
    the state folder ``server_state`` (None: ``$PROHOST_HOME/server``); see the
    module docstring.

    Cancelled (Ctrl-C): the request or the polling stops; a run already submitted
    stays on the server and goes on there (and, while waiting, says so).
    """
    try:
        base = api_base(server)
        return await _send(base, text, conversation, wait, timeout_s, fail_without_harness,
                           server_state)
    except SendError as exc:
        message = str(exc)
    except httpx.TransportError as exc:
        message = f"cannot reach the server at {server}: {str(exc) or type(exc).__name__}"
    except httpx.HTTPError as exc:
        message = f"request to {server} failed: {str(exc) or type(exc).__name__}"
    print(f"prohost send: {message}", file=sys.stderr, flush=True)
    return 1
