"""``prohost server --faults`` for the soak, plus the one hook it does not have yet.

server.py --port PORT

This is the reference server's own ``prohost server`` command
(:func:`prohost.server.main.run_server_command`, banner, signals and all) with
its fault hooks on, and one more hook:

- ``POST /v1/faults/redeliver`` ``{"run_id": "…"}``: send the run's delivery
  again, freshly signed, to the harness that holds it (else any connected one),
  whatever the run's state, as a server that lost track of an ack would; the
  harness's ack is recorded against the run like any other. Answers
  ``{"delivery_id": …, "state": …}``, or 409 when no harness is connected.

The stock hooks only redeliver runs that were never acked; the soak also needs
redeliveries of runs in flight and already reported (issue 10). Until
``prohost/server/faults.py`` grows this hook, it is added here by subclassing the
app, the only seam ``serve`` offers.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
import time
from typing import Any

import trio

import prohost.server
from prohost.protocol import Delivery, encode
from prohost.server.app import App, HttpError, Receive, _parse_json, _read_body
from prohost.server.main import run_server_command
from prohost.server.records import Connection
from prohost.server.state import ServerState
from prohost.signature import sign

#: Set (to anything) to run the stock server code without the workaround below, to
#: see whether the server still hangs.
NO_WORKAROUND_ENV = "SOAK_SERVER_AS_IS"


def _let_go_of_broken_connections() -> None:
    """Work around a server hang (reported to the lead with the soak's findings).

    ``Connection.send`` returns False without ending the connection when the
    outbox's reading end is already closed (the writer task ended, the connection
    is not removed yet). ``Deliveries.dispatch`` then keeps finding "room" on that
    connection, and ``_offer`` puts each run it failed to send back at the end of
    the waiting queue: the loop never ends, the server spins at 100% CPU and
    answers nothing more, not even SIGTERM. A kill -9 of a harness with runs
    waiting is enough. Here a connection whose outbox is gone is ended at once,
    which is what the server does for one that stopped reading.
    """
    send = Connection.send

    def send_or_let_go(self: Connection, text: str) -> bool:
        sent = send(self, text)
        if not sent:
            self.cancel_scope.cancel()
        return sent

    Connection.send = send_or_let_go  # type: ignore[method-assign]


def redeliver(state: ServerState, run_id: Any) -> tuple[int, Any, dict[str, str]]:
    """Send ``run_id``'s delivery once more (see the module docstring)."""
    run = state.runs.get(run_id) if isinstance(run_id, str) else None
    if run is None:
        raise HttpError(404, f"run_id must name a run this server knows (got {run_id!r})")
    live = [c for c in state.connections.values() if not c.cancel_scope.cancel_called]
    conns = [c for c in live if c.token == run.harness] or live
    if not conns:
        raise HttpError(409, "no harness is connected; try again once one is")
    conn = conns[-1]
    timestamp = int(time.time())
    delivery = Delivery(
        id="dlv_soak_" + secrets.token_hex(8),
        event="agent.run",
        timestamp=timestamp,
        signature=sign(state.harnesses[conn.token].secret, timestamp, run.body_text),
        body=run.body_text,
    )
    if not conn.send(encode(delivery)):
        raise HttpError(409, "the harness's connection is closing; try again")
    # So that the ack is recorded against the run (state.py's _on_ack).
    state.deliveries[delivery.id] = run.run_id
    run.delivery_ids.append(delivery.id)
    state.changed()
    return 200, {"delivery_id": delivery.id, "state": run.state}, {}


class SoakApp(App):
    """The reference app with ``POST /v1/faults/redeliver`` (reached only with faults on,
    like every fault hook: ``_fault`` is called only then)."""

    async def _fault(
        self, method: str, parts: list[str], receive: Receive
    ) -> tuple[int, Any, dict[str, str]]:
        if method == "POST" and parts == ["redeliver"]:
            raw = await _read_body(receive)
            data = _parse_json(raw) if raw.strip() else {}
            if not isinstance(data, dict):
                raise HttpError(400, "expected a JSON object {\"run_id\": …}")
            return redeliver(self.state, data.get("run_id"))
        return await super()._fault(method, parts, receive)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # serve() builds its app from this name; the soak's app is the stock one plus a hook.
    prohost.server.App = SoakApp  # type: ignore[misc]
    if not os.environ.get(NO_WORKAROUND_ENV):
        _let_go_of_broken_connections()
    return trio.run(run_server_command, "127.0.0.1", args.port, True)


if __name__ == "__main__":
    raise SystemExit(main())
