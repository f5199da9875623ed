"""Floor (e) of ``scripts/bench_e2e.py``, floor-protocol: the least that any harness
speaking docs/protocol.md must do per run, with nothing of prohost in it.

floor-ledger (d) runs an agent, makes the four durable steps §7 waits for and POSTs
the output. A harness must also take each run off its WebSocket and answer it:

- the delivery arrives as a text frame (§2): the JSON is decoded, its signature
  checked (HMAC-SHA256 over ``f"{timestamp}.{body}"``, compared in constant time,
  §3) and its body decoded;
- ``accepted`` (with the body) is committed, then the ack frame is sent (§3);
- 16 at a time: ``started``, the spawn (``sh -c cat``, the body's ``text`` on stdin),
  the process group, ``finished`` with the output, the POST to the body's
  ``completion_path`` with the token and ``Idempotency-Key`` (§7), and ``reported``
  (queued to the writer thread, not waited for, as the harness does);
- pings are answered, ``status`` and ``heartbeat`` sent (§2).

Every durable step is a commit with its fsync, made by one writer thread, as in
floor-ledger. The client, :data:`FLOOR_PROTOCOL_CLIENT`, is the least harness; the
bench uses it three ways. As floor (e), against :data:`PROTOCOL_APP` in a process of
its own (hypercorn's trio worker, as the reference server is), which, asked for
``n`` deliveries, sends them signed, at most :data:`WINDOW` unacked at a time, and
answers every POST at once; the client then prints runs/s over the batch and its own
CPU (``getrusage(RUSAGE_SELF)``: all its threads) per run, after one uncounted run,
as floor-pipe does. End to end, in the harness's place, dialling the real server
with the paired token and secret. And at rest, one run at a time, sent each
delivery from the bench's :class:`DeliverySocket`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import trio
import trio_websocket
from bench_rest import FLOOR_LEDGER, MINIMAL_APP

#: Deliveries the app lets be unacked at once (the e2e relay's window too).
WINDOW = 16

#: The secret both sides sign and check with (a bench's, not a pairing's).
SECRET = "floor-protocol-secret"

#: The server of floor-protocol. ``argv``: the secret, the window and the text size
#: of each run. Prints its base URL. On a WebSocket at ``/deliveries``, each message
#: ``n`` from the client asks for ``n`` more deliveries (at most the window unacked);
#: any POST is answered 200 at once (the minimal app's code).
PROTOCOL_APP = r"""
import hashlib, hmac, json, sys, time, trio

SECRET, WINDOW, size = sys.argv[1].encode(), int(sys.argv[2]), int(sys.argv[3])

def delivery(n):
    body = json.dumps({"run_id": f"run_{n}", "conversation_id": f"conv-{n}",
                       "kind": "message", "completion_path": f"/v1/agent/runs/run_{n}/complete",
                       "timeline_path": None, "text": "x" * size, "author": "bench",
                       "context": [], "instructions": None, "created_at": time.time()})
    stamp = int(time.time())
    signature = hmac.new(SECRET, f"{stamp}.{body}".encode(), hashlib.sha256).hexdigest()
    return json.dumps({"type": "delivery", "id": f"dlv_{n}", "event": "agent.run",
                       "timestamp": stamp, "signature": f"v1={signature}", "body": body})

async def deliveries(receive, send):
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    asked = sent = unacked = 0
    changed = trio.Event()

    async def sender():
        nonlocal sent, unacked, changed
        while True:
            while sent >= asked or unacked >= WINDOW:
                await changed.wait()
                changed = trio.Event()
            await send({"type": "websocket.send", "text": delivery(sent)})
            sent += 1
            unacked += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                break
            frame = json.loads(message["text"])
            if isinstance(frame, int):
                asked += frame
            elif frame.get("type") == "ack":
                unacked -= 1
            changed.set()
        nursery.cancel_scope.cancel()
""" + MINIMAL_APP

#: The client of floor-protocol: the least harness. ``argv``: the base URL its POSTs
#: go to, runs (0: serve until killed, asking for nothing and printing nothing), width,
#: the secret, the ledger file, and optionally the WebSocket URL it dials (else the
#: base's ``/deliveries``), the agent's shell line (else ``cat``) and a token to dial
#: and post with. It answers pings, sends ``status`` on connect and when its counts
#: change (at most every 250 ms) and a ``heartbeat`` every ``heartbeat_s``, as §2
#: asks. With runs, it asks the server for one uncounted run, then for the batch, and
#: prints one JSON line, as floor-pipe's client does.
FLOOR_PROTOCOL_CLIENT = FLOOR_LEDGER + r"""
import hashlib, hmac, math, signal, subprocess, trio_websocket

base, count, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
secret, ledger_path = sys.argv[4].encode(), sys.argv[5]
ws_url = sys.argv[6] if len(sys.argv) > 6 else "ws" + base[len("http"):] + "/deliveries"
agent = sys.argv[7] if len(sys.argv) > 7 else "cat"
token = sys.argv[8] if len(sys.argv) > 8 else "floor-token"

async def main():
    ledger = Ledger(ledger_path)
    runs_in, runs_out = trio.open_memory_channel(math.inf)
    headers = {"Authorization": f"Bearer {token}"}
    held = {}  # run id -> "queued" | "running" | "reporting"
    done = 0
    counts_changed, run_done = trio.Event(), trio.Event()
    heartbeat_s = 15.0

    def moved(run_id, state):
        nonlocal counts_changed
        if state is None:
            held.pop(run_id, None)
        else:
            held[run_id] = state
        counts_changed.set()

    async with httpx.AsyncClient() as client, trio_websocket.open_websocket_url(
            ws_url, extra_headers=[("Authorization", f"Bearer {token}"),
                                   ("X-Prohost-Machine", "floor")]) as ws:

        async def status():
            nonlocal counts_changed
            while True:
                active = sum(1 for state in held.values() if state == "running")
                await ws.send_message(json.dumps({
                    "type": "status", "version": "floor", "machine": "floor",
                    "brain": "plain", "concurrency": width, "active": active,
                    "queued": len(held) - active, "draining": False, "features": []}))
                await trio.sleep(0.25)
                await counts_changed.wait()
                counts_changed = trio.Event()

        async def heartbeats():
            seq = 0
            while True:
                await trio.sleep(heartbeat_s)
                seq += 1
                await ws.send_message(json.dumps({"type": "heartbeat", "seq": seq, "runs": [
                    {"run_id": run_id, "state": state} for run_id, state in held.items()]}))

        async def read_frames():
            # Decode, check, record, ack; the run then waits its turn.
            nonlocal heartbeat_s
            while True:
                frame = json.loads(await ws.get_message())
                kind = frame.get("type") if isinstance(frame, dict) else None
                if kind == "ping":
                    await ws.send_message(json.dumps({"type": "pong", "id": frame["id"]}))
                    continue
                if kind == "hello":
                    heartbeat_s = min(120, max(5, frame.get("heartbeat_s", 15)))
                    continue
                if kind != "delivery":
                    continue
                body = frame["body"]
                if abs(time.time() - frame["timestamp"]) > 300:
                    raise RuntimeError("a delivery's timestamp is stale")
                expected = hmac.new(secret, f"{frame['timestamp']}.{body}".encode(),
                                    hashlib.sha256).hexdigest()
                if not hmac.compare_digest("v1=" + expected, frame["signature"].lower()):
                    raise RuntimeError("a delivery's signature did not match")
                run = json.loads(body)
                await ledger.step("INSERT INTO runs (id, body, state) VALUES (?, ?, ?)",
                                  run["run_id"], body, "accepted")
                await ws.send_message(json.dumps({"type": "ack", "id": frame["id"],
                                                  "status": 200, "reason": "accepted"}))
                moved(run["run_id"], "queued")
                runs_in.send_nowait(run)

        async def one(run):
            run_id = run["run_id"]
            moved(run_id, "running")
            await ledger.step("UPDATE runs SET state = 'started' WHERE id = ?", run_id)
            proc = await trio.lowlevel.open_process(
                ["sh", "-c", agent], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                start_new_session=True)
            # The process group, durable before its output is waited on (§7).
            await ledger.step("UPDATE runs SET pgid = ? WHERE id = ?", proc.pid, run_id)
            await proc.stdin.send_all(run["text"].encode())
            await proc.stdin.aclose()
            output = bytearray()
            while chunk := await proc.stdout.receive_some():
                output += chunk
            await proc.wait()
            outcome = json.dumps({"run_id": run_id, "ok": True,
                                  "reply": output.decode()}).encode()
            await ledger.step("UPDATE runs SET state = 'finished', outcome = ? WHERE id = ?",
                              outcome.decode(), run_id)
            moved(run_id, "reporting")
            answer = await client.post(base + run["completion_path"], content=outcome,
                                       headers={**headers, "Idempotency-Key": run_id,
                                                "Content-Type": "application/json"})
            answer.raise_for_status()
            ledger.soon("UPDATE runs SET state = 'reported' WHERE id = ?", run_id)
            moved(run_id, None)

        async def worker():
            nonlocal done, run_done
            async for run in runs_out:
                await one(run)
                done += 1
                run_done.set()
                run_done = trio.Event()

        async def until_done(n):
            while done < n:
                await run_done.wait()

        async def until_sigterm():
            # Asked to stop (in the harness's place, by SIGTERM): stop taking work and
            # let ledger.close() below commit the ``reported`` steps still queued, as
            # a harness's drain would; the default action would drop them.
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

        async with trio.open_nursery() as nursery:
            for task in [read_frames, status, heartbeats, until_sigterm] + [worker] * width:
                nursery.start_soon(task)
            if count == 0:
                await trio.sleep_forever()
            # One uncounted run: imports, the first connection and the first spawn.
            await ws.send_message("1")
            await until_done(1)
            cpu_began, machine_began, began = cpu(), machine(), time.perf_counter()
            await ws.send_message(str(count))
            await until_done(1 + count)
            seconds, used = time.perf_counter() - began, cpu() - cpu_began
            machine_used = machine() - machine_began
            nursery.cancel_scope.cancel()
    ledger.close()
    if count == 0:
        return  # stopped in the harness's place: the figures are the bench's to take
    print(json.dumps({"runs": count, "seconds": seconds, "runs_per_s": count / seconds,
                      "cpu_ms_per_run": used * 1e3 / count,
                      "machine_cpu_ms_per_run": machine_used * 1e3 / count}), flush=True)

trio.run(main)
"""


def signed_delivery(delivery_id: str, run_id: str, text: str, completion_path: str,
                    secret: str = SECRET) -> str:
    """A delivery frame as docs/protocol.md §2–3 has it, signed with ``secret``."""
    body = json.dumps({"run_id": run_id, "conversation_id": f"conv-{run_id}",
                       "kind": "message", "completion_path": completion_path,
                       "timeline_path": None, "text": text, "author": "bench", "context": [],
                       "instructions": None, "created_at": time.time()})
    stamp = int(time.time())
    signature = hmac.new(secret.encode(), f"{stamp}.{body}".encode(), hashlib.sha256)
    return json.dumps({"type": "delivery", "id": delivery_id, "event": "agent.run",
                       "timestamp": stamp, "signature": f"v1={signature.hexdigest()}",
                       "body": body})


class DeliverySocket:
    """The server's end of floor-protocol at rest: a trio-websocket server in this
    process, dialled by one floor-protocol client; :meth:`send` writes a delivery
    frame to it, and ``acks`` counts the acks it sends back."""

    def __init__(self) -> None:
        self.url = ""
        self.acks = 0
        self._connection: trio_websocket.WebSocketConnection | None = None
        self._connected = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen on 127.0.0.1 until cancelled. Cancelled: the server and its one
        connection are closed."""
        async with trio.open_nursery() as nursery:
            server = await nursery.start(trio_websocket.serve_websocket, self._accept,
                                         "127.0.0.1", 0, None)
            self.url = f"ws://127.0.0.1:{server.port}/"
            task_status.started()

    async def _accept(self, request: trio_websocket.WebSocketRequest) -> None:
        self._connection = await request.accept()
        self._connected.set()
        try:
            while True:
                # The client's asks ("1", then the count) and its acks.
                frame = json.loads(await self._connection.get_message())
                if isinstance(frame, dict) and frame.get("type") == "ack":
                    self.acks += 1
        except trio_websocket.ConnectionClosed:
            return

    async def send(self, frame: str) -> None:
        """Write one frame to the client, once it has connected."""
        await self._connected.wait()
        assert self._connection is not None
        await self._connection.send_message(frame)
