"""The run ledger: every run's life on disk, so nothing is run twice and nothing is lost.

docs/protocol.md §3 and §7. A run is written ``accepted`` (with its signed body) before its
delivery is acked, ``started`` just before its agent is spawned, ``finished`` with the
outcome to post (the ledger is the outbox), and ``reported`` once the report settled.
After a crash or ``kill -9`` the next start can tell exactly what to do with every run
(:meth:`Ledger.recover`), and a redelivery of a run already in the ledger is never
executed again (:meth:`Ledger.admit`).

The same file keeps the agent session each lane last ended with, so a conversation's
next turn resumes it across restarts.

Group commit. Every write is a function of the write connection, queued; one caller
at a time is the *writer*: it takes every write waiting at that moment, applies them
in one ``BEGIN IMMEDIATE … COMMIT`` (each inside its own ``SAVEPOINT``, so a write that
fails — a harness bug, a constraint — fails only its own caller), and wakes each
caller once the commit is done. The writer is simply the first caller that finds no
writer at work (a worker thread of ``trio.to_thread``); when it is done it hands the
role to the first waiting caller, whose write the next batch carries. So one write
at a time costs one transaction, as it always did, and 16 busy lanes share one
commit instead of queueing for 16. Reads go to a second connection (WAL lets it read
the last commit while a write is under way); :meth:`Ledger.committed` never queues
behind writes, while ``get`` and ``recover`` first wait for what is queued.

Durable (``synchronous=FULL``: the commit fsyncs the WAL) or not. A batch that holds a
durable write is committed with ``FULL``; a batch of only non-durable writes with
``NORMAL``, which writes the WAL without an fsync. Such a commit survives the death of
the process (``kill -9``, a crash: the pages are the kernel's), and is lost only when
the machine itself goes down before the next fsync — and every later durable commit
fsyncs it too, since the WAL is one file written in order. A non-durable caller does
not wait for a commit already under way: it returns once its write is queued for the
next one (errors are then logged, not raised).

Each step of a run, and whether the harness waits for its fsync before going on:

=================  =========  ========================================================
step               durable    why
=================  =========  ========================================================
``admit``          yes        the ack promises the run survives a crash (§3, §7)
``mark_started``   yes        before the spawn: a run found ``accepted`` after a crash
                              is run again, so a spawned one must never look so
``record_pgid``    yes        right after the spawn, before the agent's output is
                              read: a restart kills the group only if it was
                              written; the run stops if it cannot be (§7). With
                              it, what the run's checkouts were as it began
                              (``start_state``): a restart reports its changes
``record_cancel``  yes        a server's cancel of a run not finished, before its agent
                              is stopped: a restart reports it cancelled, never runs
                              it again (§6); ``mark_finished`` replaces it
``flag_earlier_``  yes        at a restart, for each run interrupted: its lane's
``turns``                     sessions' totals say ``includes_earlier_turns`` (§7);
                              logged, never stops the start
``save_turn``      no         written just before ``mark_finished``, so it is in that
                              commit (or an earlier one): finished ⇒ session kept
``mark_finished``  yes        the outcome is the outbox: durable before the POST
``mark_reported``  no         lost only with the machine; the next start then posts the
                              saved outcome again, which the server answers 409 (§7)
``prune``          yes        rare; nothing waits on it
=================  =========  ========================================================

(``mark_reported`` from :mod:`prohost.engine.harness`, closing an unreadable row, stays durable:
it is met at start only.) So a run costs four fsync'd steps, shared with whatever other
runs are writing at the same moment, where it used to cost six.

On macOS (``sys.platform == "darwin"``) ``fsync`` leaves the data in the drive's
cache, so the write connection also sets ``fullfsync`` and ``checkpoint_fullfsync``.

The writer thread. While a harness runs, the writer is one long-lived thread
(:mod:`prohost.engine.ledger.served`, started and joined by the harness): a step
from the trio thread is a job on its ``queue.SimpleQueue``, whose writes join the
next batch, and the caller is woken through ``TrioToken.run_sync_soon`` (one per
batch) — no worker thread per step. ``mark_reported`` is queued from the trio
thread itself (``queue_only``). A non-durable write a step queues before a durable
one (the session before ``finished``) is committed first, as when the step's
caller was the writer. Reads stay in worker threads, on the read connection. With
no writer thread (commands, sync callers), the first caller that finds no writer
at work leads, as described above; sync callers work beside the thread too.

The file and its ``-wal``/``-shm`` are mode 0600 whatever the umask: they hold run
bodies, MCP tokens and conversation text.

:class:`Ledger` is synchronous; the harness calls it through
:meth:`prohost.engine.blocking.Bounds.run`, from any number of worker threads, or as
a job for the writer thread (waited for through ``Bounds.wait``: the same bound and
shield). A call on a
hung disk is abandoned after its bound, and that is safe: the call's write stays in
the queue (or in the batch under way) and the writer applies it whenever the disk
answers — writes are whole transactions, so the file stays consistent — while the
abandoned caller's thread waits at most :data:`LOCK_WAIT_S` and then gives up; the
step's durability is merely unknown, and the next start reads the ledger (§7) and
reports whatever it finds. The one exception is ``accepted``, since a 503 tells the
server to run the run elsewhere: a 503 must mean "not recorded", for good, across a
``kill -9`` at any point (issue 27, point 3). So before any 503 for a run,
:meth:`Ledger.withdraw_admits` withdraws every ``accepted`` write of it not applied
yet — it inserts nothing when the disk answers; nothing was written, so no crash can
bring a row back — and a write already inserting its row in a transaction the disk
has not settled holds the ack back (:class:`prohost.engine.supervisor.admission.AckLater`,
sent from a task of its own, so the reader goes on) until the disk says whether it
landed; the last commit then answers, for good: 200 for a row there, 503 for none.
(Taking a landed row back with a later delete, as prohost once did, cannot close
it: a ``kill -9`` between the row's commit and the delete's leaves a run answered
503 for the next start to run, and the delete is written to the disk that hangs.
Nor can a row inserted "unconfirmed" and confirmed before the 200: the confirming
write can be the one under way at the bound.) Nobody else touches the write connection meanwhile: a
later writer waits for it at most :data:`LOCK_WAIT_S`, then fails every write it
holds with :class:`LedgerError`.

Retention (the exactly-once window; the periods are
:mod:`prohost.engine.retention`'s): a reported run keeps its body and outcome for
7 days (``KEEP_RUNS_S``); then :meth:`Ledger.prune` empties them, leaving a
tombstone — run id, state and when it was reported — for 30 days after the report
(``KEEP_TOMBSTONES_S``). Any redelivery within those 30 days is answered 204 and
never runs. A redelivery later than that is executed again: the server must not
redeliver a run it has seen reported for a month.
"""

from prohost.engine.ledger.rows import (
    Admitted,
    LedgerError,
    LedgerOrderError,
    LedgerRow,
    LedgerStatistics,
    RunState,
    UnreportedRuns,
)
from prohost.engine.ledger.schema import FILE_MODE, SCHEMA_VERSION, LedgerUnavailable
from prohost.engine.ledger.store import AdmitTicket, Ledger
from prohost.engine.ledger.writer import CLOSE_WAIT_S, LOCK_WAIT_S, _Write

__all__ = [
    "CLOSE_WAIT_S",
    "FILE_MODE",
    "LOCK_WAIT_S",
    "SCHEMA_VERSION",
    "AdmitTicket",
    "Admitted",
    "Ledger",
    "LedgerError",
    "LedgerOrderError",
    "LedgerRow",
    "LedgerStatistics",
    "LedgerUnavailable",
    "RunState",
    "UnreportedRuns",
    "_Write",
]
