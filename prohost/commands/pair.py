"""``prohost agent pair``: trade a one-time code for this machine's credentials (§10)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import httpx
import trio

from prohost import AGENT_HEADER_VALUE
from prohost.home import (
    GC,
    LOCK_FILE,
    LockHeld,
    credentials_from_json,
    gc_holds_it,
    resolve_endpoints,
    save_credentials,
    stop_advice,
    take_lock,
)
from prohost.invocation import command

log = logging.getLogger("prohost.pair")

PAIR_TIMEOUT_S = 30.0
#: A harness runs on the home: pairing now would pull its credentials from under it.
EXIT_HARNESS_RUNNING = 2
_MAX_ERROR_TEXT = 300


def _fail(message: str) -> int:
    print(f"prohost agent pair: error: {message}", file=sys.stderr)
    return 1


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_ERROR_TEXT else flat[: _MAX_ERROR_TEXT - 1] + "…"


def _server_error_text(response: httpx.Response) -> str:
    """The server's own explanation: a JSON ``error``/``message``/``detail``, else the body."""
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict):
        for key in ("error", "message", "detail"):
            value = data.get(key)
            if isinstance(value, str) and value.strip():
                return _one_line(value)
    return _one_line(response.text) or "(no explanation in the response)"


def _running_message(err: LockHeld, home: Path, code: str, url: str | None) -> str:
    if err.kind == GC:
        return gc_holds_it(err, home, "pair again once it is done (nothing was sent; the "
                           "code is still unused)")
    who = f"a prohost agent (pid {err.pid})" if err.pid else "a prohost agent"
    other = "/some/other/dir"
    pair_words = ["--code", code, *(["--url", url] if url else [])]
    return (
        f"{who} is running with PROHOST_HOME={home}; pairing now would replace the "
        f"credentials it uses (nothing was sent; the code is still unused). Either stop "
        f"it first ({stop_advice(err)}) and pair again, or pair another home with this "
        f"code and run a second harness there: `PROHOST_HOME={other} "
        f"{command('agent', 'pair', *pair_words)}`, then "
        f"`PROHOST_HOME={other} {command('agent', 'run')} ...`"
    )


async def pair_command(code: str, url: str | None, machine: str, home: Path) -> int:
    """Pair this machine unless a harness runs on ``home`` (exit 2, before the code
    is spent); see :func:`_pair` for the rest. The home's lock, when it has one, is
    held while pairing, so no harness starts on half-written credentials either.

    Cancelled: as :func:`_pair`; the lock is given up.
    """
    try:
        fd = _hold_existing_lock(home)
    except LockHeld as err:
        print(f"prohost agent pair: error: {_running_message(err, home, code, url)}",
              file=sys.stderr)
        return EXIT_HARNESS_RUNNING
    try:
        return await _pair(code, url, machine, home)
    finally:
        if fd is not None:
            os.close(fd)  # gives the flock up


def _hold_existing_lock(home: Path) -> int | None:
    """Take the home's lock (:class:`prohost.home.InstanceLock`'s flock) if the home
    has a lock file, and return its descriptor; raise :class:`LockHeld` when a
    harness holds it. Creates nothing: a pairing that fails leaves no trace."""
    try:
        return take_lock(home / LOCK_FILE, create=False)
    except OSError:
        return None  # a lock file we may not open: no harness of ours ran here


async def _pair(code: str, url: str | None, machine: str, home: Path) -> int:
    """Pair this machine: POST the code, save the credentials, return the exit code.

    ``url`` is ``--url`` or ``$PROHOST_WS_URL`` (None: the built-in default); the
    pairing API base is derived from it as docs/protocol.md §1 says. Errors are one
    line on stderr and exit code 1; nothing is written unless pairing succeeded.
    The token and secret are never printed or logged.

    Cancelled during the request, nothing has been saved and the cancellation
    propagates. The save itself runs in a worker thread that is waited for, so a
    cancellation arriving then takes effect only after the file is complete.
    """
    try:
        _, api_base = resolve_endpoints(url, None)
    except ValueError as exc:
        return _fail(f"cannot derive the pairing address: {exc}")
    endpoint = f"{api_base}/v1/agent/pair"
    log.debug("pairing %s at %s", machine, endpoint)
    try:
        async with httpx.AsyncClient(timeout=PAIR_TIMEOUT_S) as client:
            response = await client.post(
                endpoint,
                json={"code": code, "machine": machine},
                headers={"X-Prohost-Agent": AGENT_HEADER_VALUE},
            )
    except httpx.ConnectError as exc:
        return _fail(f"cannot connect to {api_base}: {_one_line(str(exc)) or 'connection failed'}")
    except httpx.TimeoutException:
        return _fail(f"{api_base} did not answer within {PAIR_TIMEOUT_S:.0f} s; try again")
    except httpx.HTTPError as exc:
        reason = _one_line(str(exc)) or type(exc).__name__
        return _fail(f"pairing request to {endpoint} failed: {reason}")

    if not response.is_success:
        # HTTP/1.1 servers may send no reason phrase; the standard one still helps.
        phrase = response.reason_phrase or httpx.codes.get_reason_phrase(response.status_code)
        return _fail(
            f"the server refused the pairing ({response.status_code} {phrase}".rstrip()
            + f"): {_server_error_text(response)}"
        )
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _fail(f"the server's answer from {endpoint} is not JSON; nothing was saved")
    try:
        creds = credentials_from_json(data, "the server's answer")
    except ValueError as exc:
        return _fail(f"{exc}; nothing was saved")

    try:
        path = await trio.to_thread.run_sync(save_credentials, home, creds)
    except OSError as exc:
        return _fail(f"cannot save the credentials in {home}: {exc.strerror or exc}")

    account = f" to account {creds.account}" if creds.account else ""
    print(f"Paired {machine}{account}. Credentials saved in {path} (mode 0600).")
    # The default --exec is `claude -p`; the README's step-by-step names others.
    print(f"Start the agent with: {command('agent', 'run')}")
    return 0
