"""``prohost runs show|cancel ID``: look up or cancel a run on a reference server
(docs/protocol.md §11: ``GET`` and ``DELETE /v1/runs/<id>``).

A run is named by its id or by the first characters of it, with or without ``run_``
(the server's list of runs says which run they are). Exit status: 0 done; 1 the
server could not be reached, has no such run, or (cancel) the run has ended
already; 2 more than one run starts with the characters given (each is listed).
Every failure is one line on stderr (a list of runs after it, for 2).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx

from prohost.commands.send import (
    TERMINAL_STATES,
    SendError,
    api_base,
    api_headers,
    what_the_run_did,
)
from prohost.invocation import command


def _fail(verb: str, message: str) -> int:
    print(f"prohost runs {verb}: {message}", file=sys.stderr, flush=True)
    return 1


def _error_of(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        data = None
    detail = data.get("error") if isinstance(data, dict) else None
    return str(detail or response.text.strip()[:200] or response.reason_phrase)


#: Every run id the server makes starts so; a person may leave it out.
RUN_ID_PREFIX = "run_"


async def _named(client: httpx.AsyncClient, verb: str, typed: str) -> str | int:
    """The id of the one run ``typed`` names when the server has no run of that
    id: the run whose id starts with it (or with ``run_`` then it); else
    ``typed`` (the server's 404 then says so), or exit status 2 after listing the
    runs that start with it."""
    listed = await client.get("/v1/runs")
    runs = listed.json().get("runs") if listed.is_success else None
    ids: list[str] = [run["run_id"] for run in runs or ()
                      if isinstance(run, dict) and isinstance(run.get("run_id"), str)]
    found = [run_id for run_id in ids
             if run_id.startswith(typed) or run_id.startswith(RUN_ID_PREFIX + typed)]
    if len(found) == 1:
        return found[0]
    if not found or not typed:
        return typed
    _fail(verb, f"{len(found)} runs start with {typed!r}; type more of the one you mean:")
    for run_id in found:
        print(f"  {run_id}", file=sys.stderr, flush=True)
    return 2


def run_lines(run: dict[str, Any], server: str) -> list[str]:
    """A run as a person reads it: what it is, where it stands, how it ended
    (``server``: where it is, for the command that shows its retry)."""
    lines = [f"run {run.get('run_id')}: {run.get('state')}"]
    attempt = run.get("attempt")
    fields = (("conversation", run.get("conversation_id")), ("machine", run.get("machine")),
              ("deliveries", run.get("deliveries")),
              ("attempt", attempt if isinstance(attempt, int) and attempt > 1 else None),
              ("retry of", run.get("retry_of")), ("activity", run.get("activity")))
    lines.extend(f"  {name}: {value}" for name, value in fields if value is not None)
    text = run.get("text")
    if isinstance(text, str):
        lines.append(f"  text: {text if len(text) <= 200 else text[:199] + '…'}")
    if run.get("cancel_requested") and run.get("state") not in TERMINAL_STATES:
        # (Once it has ended, its error says how: no longer "stopping".)
        lines.append("  cancel requested: the harness is stopping it")
    if isinstance(run.get("reply"), str):
        lines.append("  reply:")
        lines.extend(f"    {line}" for line in str(run["reply"]).splitlines() or [""])
    if run.get("error"):
        lines.append(f"  error: {run['error']}")
    if isinstance(run.get("retried_as"), str):
        retry = run["retried_as"]
        lines.append(f"  retried as {retry} (the failure was retryable): "
                     f"{command('runs', 'show', '--server', server, retry)}")
    lines.extend(what_the_run_did(run))
    return lines


async def runs_show_command(server: str, run_id: str, as_json: bool) -> int:
    """Print run ``run_id`` as ``server`` has it. Cancelled: the request stops;
    nothing was changed."""
    try:
        base = api_base(server)
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
            response = await client.get(f"/v1/runs/{run_id}")
            if response.status_code == 404:
                named = await _named(client, "show", run_id)
                if isinstance(named, int):
                    return named
                if named != run_id:
                    response = await client.get(f"/v1/runs/{named}")
    except SendError as exc:
        return _fail("show", str(exc))
    except httpx.HTTPError as exc:
        return _fail("show", f"cannot reach the server at {server}: {exc or type(exc).__name__}")
    if not response.is_success:
        return _fail("show", f"the server answered {response.status_code}: {_error_of(response)}")
    run = response.json()
    if as_json:
        print(json.dumps(run, indent=2), flush=True)
    else:
        print("\n".join(run_lines(run, server)), flush=True)
    return 0


async def runs_cancel_command(server: str, run_id: str, reason: str | None,
                              server_state: str | None = None) -> int:
    """Cancel run ``run_id`` on ``server`` (a queued run never starts; a running one is
    stopped by its harness and reported cancelled), with the API token from the state
    folder ``server_state`` (None: ``$PROHOST_HOME/server``). Cancelled: the request
    stops; the server may or may not have heard it (``runs show`` tells)."""
    try:
        base = api_base(server)
        headers = api_headers(server_state)
        async with httpx.AsyncClient(base_url=base, timeout=30.0) as client:
            response = await client.request(
                "DELETE", f"/v1/runs/{run_id}", headers=headers,
                json={"reason": reason} if reason else None)
            if response.status_code == 404:
                named = await _named(client, "cancel", run_id)
                if isinstance(named, int):
                    return named
                if named != run_id:
                    run_id = named
                    response = await client.request(
                        "DELETE", f"/v1/runs/{run_id}", headers=headers,
                        json={"reason": reason} if reason else None)
    except SendError as exc:
        return _fail("cancel", str(exc))
    except httpx.HTTPError as exc:
        return _fail("cancel",
                     f"cannot reach the server at {server}: {exc or type(exc).__name__}")
    if not response.is_success:
        return _fail("cancel",
                     f"the server answered {response.status_code}: {_error_of(response)}")
    run = response.json()
    if run.get("state") == "cancelled":
        print(f"run {run_id} cancelled", flush=True)
    else:
        print(f"run {run_id}: cancel sent; its harness is stopping it "
              f"(`{command('runs', 'show', '--server', server, run_id)}` says when it "
              "has)", flush=True)
    return 0
