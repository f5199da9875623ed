"""``prohost send``: submit a request to a reference server (docs/protocol.md §11).

Prints the new run's id; with ``wait``, polls the run until it ends and prints its
reply (``(no reply)`` when the agent chose not to answer). A run the server retries
(a retryable failure, submitted again as a new run) is followed to its end.

While the run waits for a harness and none is connected, it says so once (a person
would otherwise wait in silence forever) and keeps waiting; with
``fail_without_harness`` it gives up instead (exit 3, the run left queued). Ctrl-C
says the run goes on at the server (exit 130). Every other failure is one line on
stderr and exit status 1.
"""

from __future__ import annotations

import signal
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


async def _connected(client: httpx.AsyncClient) -> int | None:
    """How many harnesses the server has now (None: a server without ``/v1/status``)."""
    answer = await client.get("/v1/status")
    if not answer.is_success:
        return None
    data = answer.json()
    count = data.get("connected") if isinstance(data, dict) else None
    return count if isinstance(count, int) else None


async def _wait_for_end(
    client: httpx.AsyncClient, following: list[str], fail_without_harness: bool
) -> dict[str, Any]:
    """Poll the last run of ``following`` until it ends; a retry the server made of
    it is appended and followed. Cancelled: stops polling; nothing changes."""
    delay = POLL_FIRST_S
    told_alone = False
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
            connected = await _connected(client)
            if connected == 0 and fail_without_harness:
                raise NoHarness(run_id)
            if connected == 0 and not told_alone:
                told_alone = True
                _say(f"no harness is connected to the server: run {run_id} waits there "
                     "until one connects (start one with `prohost agent run`); still "
                     "waiting (Ctrl-C stops waiting; the run stays on the server)")
            elif connected and told_alone:
                told_alone = False
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
    fail_without_harness: bool = False,
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
        following = [run_id]
        try:
            run, interrupted = await _wait_unless_interrupted(
                client, following, fail_without_harness, timeout_s)
        except NoHarness:
            _say(f"no harness is connected to the server, so run {following[-1]} cannot "
                 "start; it stays queued there and runs when one connects "
                 f"(`prohost runs cancel {following[-1]}` drops it)")
            return EXIT_NO_HARNESS
        if interrupted:
            _say(f"stopped waiting; run {following[-1]} goes on at the server "
                 f"(`prohost runs show {following[-1]}` to look, `prohost runs cancel "
                 f"{following[-1]}` to stop it)")
            return EXIT_INTERRUPTED
        if run is None:
            raise SendError(f"run {following[-1]} did not finish within {timeout_s:g} s; it "
                            f"goes on at the server (`prohost runs show {following[-1]}`)")
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
    fail_without_harness: bool = False,
) -> int:
    """Submit ``text`` (in ``conversation``) to ``server``; see the module docstring.

    Cancelled (Ctrl-C): the request or the polling stops; a run already submitted
    stays on the server and goes on there (and, while waiting, says so).
    """
    try:
        base = api_base(server)
        return await _send(base, text, conversation, wait, timeout_s, fail_without_harness)
    except SendError as exc:
        message = str(exc)
    except httpx.TransportError as exc:
        message = f"cannot reach the server at {server}: {str(exc) or type(exc).__name__}"
    except httpx.HTTPError as exc:
        message = f"request to {server} failed: {str(exc) or type(exc).__name__}"
    print(f"prohost send: {message}", file=sys.stderr, flush=True)
    return 1
