"""Where prohost's log lines go: the terminal (:func:`setup_logging`), and the
harness's own log file, ``$PROHOST_HOME/logs/agent.log``, rotated by size.

A harness left running for weeks under a service manager must not fill the disk,
and its log must be somewhere the user can find without knowing journalctl. So
it writes the file itself and rotates it at ``max_bytes``, keeping ``backups``
old ones (``agent.log.1`` is the newest); the service manager's stdout/stderr
then only catch what escapes logging.

The log holds run ids, conversation names, errors from the agent CLIs: it is
private (folder 0700, files 0600, rotated ones included). The prohost token and
secret must never appear in it, even in an exception's text: :func:`redact`.

The file is written by a thread of its own (:class:`FileLogHandler`, a
``QueueHandler`` whose ``QueueListener`` writes): a log line from the trio thread
only queues the record, so a hung disk (an NFS home that stopped answering)
cannot stall the event loop, and with it the second signal's 5-second window.
The queue keeps the order; the last lines are written when the handler is
closed (``logging.shutdown`` at exit, the third signal included), each wait for
the disk bounded by :data:`LOG_DRAIN_S`.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import queue
import sys
import threading
from collections.abc import Iterable, Mapping
from io import TextIOWrapper
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from prohost.home import make_private_home

if TYPE_CHECKING:
    from rich.console import Console

LOG_DIR = "logs"
LOG_FILE = "agent.log"

#: The service sets ``PROHOST_LOG=file`` so the harness logs to :func:`log_path`.
LOG_ENV = "PROHOST_LOG"
LOG_TO_FILE = "file"

MASK = "[redacted]"

_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def log_path(home: Path) -> Path:
    """``home/logs/agent.log``."""
    return home / LOG_DIR / LOG_FILE


def wants_file_logging(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for :func:`log_to_file` (the daemon's does)."""
    return env.get(LOG_ENV, "").strip().lower() == LOG_TO_FILE


#: The record :meth:`PrivateRotatingFileHandler.flush` names when a flush fails.
_FLUSHING = logging.makeLogRecord({"msg": "flushing the log file"})


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler whose every file, the ones it creates at rollover included,
    is 0600 from the moment it exists, whatever the umask.

    It writes in whichever thread calls it: :class:`FileLogHandler`'s listener, so
    never the trio thread.
    """

    #: Whether the last write failed (said once on stderr until one succeeds again).
    _failing = False
    _erred = False

    def emit(self, record: logging.LogRecord) -> None:
        self._erred = False
        super().emit(record)
        if self._failing and not self._erred:
            self._failing = False  # the disk has room again: the next failure is said

    def handleError(self, record: logging.LogRecord) -> None:
        """One line on stderr when the file cannot be written (a full disk), not
        logging's traceback per record: the harness goes on, and its terminal or
        journal still has every line."""
        self._erred = True
        if self._failing:
            return
        self._failing = True
        error = sys.exc_info()[1]
        reason = getattr(error, "strerror", None) or error
        with contextlib.suppress(Exception):
            sys.stderr.write(f"prohost: cannot write the log file {self.baseFilename} "
                             f"({reason}); its lines are lost until it can be written\n")
            sys.stderr.flush()

    def flush(self) -> None:
        try:
            super().flush()
        except OSError:
            self.handleError(_FLUSHING)

    def close(self) -> None:
        # Closing writes what is buffered: on a full disk those lines are lost
        # (said already), and the exit goes on.
        with contextlib.suppress(OSError):
            super().close()

    def _open(self) -> TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            # An older file (another umask, another version) is narrowed too.
            os.fchmod(fd, 0o600)
            # "a": RotatingFileHandler always appends once maxBytes is set.
            return open(fd, "a", encoding=self.encoding, errors=self.errors)
        except BaseException:
            os.close(fd)
            raise


#: Records waiting for the log file; past this many (a disk hung for long), new
#: ones are dropped and counted rather than held in memory without end.
LOG_QUEUE_RECORDS = 10_000
#: How long a flush or close waits for the log file's thread (s): the last lines
#: are written unless the disk is hung, and exit is never held longer.
LOG_DRAIN_S = 2.0


class _FlushMark(logging.LogRecord):
    """Not a line: set once every record queued before it has been written."""

    def __init__(self) -> None:
        super().__init__("prohost.logfile", logging.DEBUG, __file__, 0, "", None, None)
        self.written = threading.Event()


class _Listener(logging.handlers.QueueListener):
    def __init__(self, records: queue.Queue[logging.LogRecord | None],
                 target: logging.Handler, dropped: _Dropped) -> None:
        super().__init__(records, target, respect_handler_level=True)
        self._dropped = dropped

    def handle(self, record: logging.LogRecord) -> None:
        if isinstance(record, _FlushMark):
            for handler in self.handlers:
                handler.flush()
            record.written.set()
            return
        lost = self._dropped.take()
        if lost:
            super().handle(logging.makeLogRecord({
                "name": "prohost.logfile", "levelno": logging.WARNING,
                "levelname": "WARNING",
                "msg": f"{lost} log line(s) were dropped: the log file was not writable",
            }))
        super().handle(record)


class _Dropped:
    """How many records found the queue full, since the listener last said so."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def add(self) -> None:
        with self._lock:
            self._count += 1

    def take(self) -> int:
        with self._lock:
            count, self._count = self._count, 0
            return count


class FileLogHandler(logging.handlers.QueueHandler):
    """Queues each record for a thread that writes it to ``target`` (the log file).

    Filters on this handler (:func:`add_redaction`) run before the record is queued,
    on the logging thread, so the file only ever sees masked text. Logging never
    waits for the disk: when the queue is full, the record is dropped and counted,
    and the file says how many were lost once it can be written again.
    """

    def __init__(self, target: logging.FileHandler) -> None:
        records: queue.Queue[logging.LogRecord | None] = queue.Queue(LOG_QUEUE_RECORDS)
        super().__init__(records)
        self.target = target
        #: The file it writes (what a FileHandler would call it).
        self.baseFilename = target.baseFilename
        self.setLevel(target.level)
        self._records = records
        self._dropped = _Dropped()
        self._stuck = False
        self._listener: _Listener | None = _Listener(records, target, self._dropped)
        self._listener.start()

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self._records.put_nowait(record)
        except queue.Full:
            self._dropped.add()

    def flush(self) -> None:
        """:meth:`drain` (``logging.shutdown`` calls it before :meth:`close`)."""
        self.drain()

    def drain(self, timeout_s: float = LOG_DRAIN_S) -> bool:
        """Wait (at most ``timeout_s``) until every record queued so far is in the
        file; whether it is. Blocking: not for the trio thread."""
        if self._listener is None:
            return True
        mark = _FlushMark()
        try:
            self._records.put(mark, timeout=timeout_s)
        except queue.Full:
            self._stuck = True
            return False
        written = mark.written.wait(timeout_s)
        # Then the disk is hung: close (next, in logging.shutdown) waits no more.
        self._stuck = not written
        return written

    def close(self) -> None:
        """Write what is queued and stop the thread, waiting at most
        :data:`LOG_DRAIN_S`; the file is closed once the thread has ended (on a hung
        disk it is left to the process's exit: the thread is a daemon)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # Not listener.stop(): it waits for the thread without a bound.
            thread = listener._thread
            with contextlib.suppress(queue.Full):
                self._records.put(None, timeout=LOG_DRAIN_S)  # the listener's sentinel
            if thread is not None:
                thread.join(0 if self._stuck else LOG_DRAIN_S)
            if thread is None or not thread.is_alive():
                self.target.close()
        super().close()


def log_to_file(
    home: Path,
    *,
    max_bytes: int = 10 * 1024 * 1024,
    backups: int = 5,
    level: int = logging.INFO,
    logger_name: str = "prohost",
) -> Path:
    """Send ``logger_name``'s records at ``level`` and above to ``home/logs/agent.log`` too.

    The file is rotated when a record would take it past ``max_bytes``; at most
    ``backups`` rotated files are kept. Calling it again replaces the handler it
    added before (so a second ``main()`` in one process does not double lines).
    Returns the log's path.
    """
    if max_bytes < 1 or backups < 1:
        # RotatingFileHandler treats 0 as "never rotate": the unbounded file this prevents.
        raise ValueError(f"max_bytes and backups must be at least 1 (got {max_bytes}, {backups})")
    # The home first, 0700 whatever the umask (narrowed with a warning if looser).
    make_private_home(home)
    folder = home / LOG_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    path = log_path(home)
    target = PrivateRotatingFileHandler(
        path,
        maxBytes=max_bytes,
        backupCount=backups,
        encoding="utf-8",
        # A path or agent output with undecodable bytes must not cost the log line.
        errors="backslashreplace",
    )
    target.setFormatter(logging.Formatter(_FORMAT))
    target.setLevel(level)
    handler = FileLogHandler(target)
    logger = logging.getLogger(logger_name)
    for old in [h for h in logger.handlers if isinstance(h, FileLogHandler)]:
        logger.removeHandler(old)
        old.close()
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    return path


class RedactingFilter(logging.Filter):
    """Replaces each secret with :data:`MASK` in a record's message, args, exception and
    stack text.

    The message is formatted first and the args dropped: a secret can hide inside an
    arg's repr (a dict, an exception, a URL object), where replacing in the args
    themselves would miss it. Every handler sees the masked record afterwards, and
    masking again changes nothing, so the filter may sit on several handlers.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        # Longest first, so a secret that contains another is masked whole. Empty ones are
        # dropped: masking "" would put the mask between every character.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def mask(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging would print msg and args raw
            message = f"{record.msg!s} {record.args!r}"
        record.msg = self.mask(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = _TRACEBACKS.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.mask(record.exc_text)
        if record.stack_info:
            record.stack_info = self.mask(record.stack_info)
        return True


_TRACEBACKS = logging.Formatter()


def redact(*secrets: str) -> logging.Filter:
    """A filter that masks ``secrets`` (the token and the secret) in every record it sees.

    Put it on handlers, not loggers: a logger's filters only see records logged on that
    very logger, not on its children (``prohost.engine.link.connection`` bypasses a
    filter on ``prohost``).
    """
    return RedactingFilter(secrets)


def add_redaction(*secrets: str, logger_names: Iterable[str] = ("", "prohost")) -> logging.Filter:
    """Put one :func:`redact` filter on every handler of the given loggers (root and
    ``prohost``: where ``setup_logging`` and :func:`log_to_file` put theirs); return it.

    Call it once the credentials are loaded and the handlers are in place; a handler
    added later does not get it.
    """
    redacting = redact(*secrets)
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if redacting not in handler.filters:
                handler.addFilter(redacting)
    return redacting


_installed_handler: logging.Handler | None = None

#: A record with this attribute set (``extra=FILE_ONLY``) goes to the log file and
#: not to the terminal: the live panel already shows what it says there, and the
#: file must still say it (``agent logs`` reads the same lines with or without it).
FILE_ONLY = {"prohost_file_only": True}


class _NotFileOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "prohost_file_only", False)


def log_handler(console: Console) -> logging.Handler:
    """A ``RichHandler`` on ``console``: on a live panel's console, log lines print
    above the panel (:mod:`prohost.engine.view.panel`) instead of tearing it."""
    from rich.logging import RichHandler

    handler = RichHandler(console=console, show_path=False)
    handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    return handler


def setup_logging(
    verbose: bool, console: Console | None = None, stream: TextIO | None = None
) -> None:
    """Log to ``stream`` (stderr by default): rich on a terminal, plain timestamped
    lines otherwise; through ``console`` (the live panel's) when one is given.

    ``-v`` turns on debug for prohost's own loggers only: the libraries' debug
    output (HTTP and WebSocket internals) is noise, and can carry request headers,
    which is where the token travels.
    """
    global _installed_handler
    root = logging.getLogger()
    if _installed_handler is not None:
        # Calling main() twice in one process (tests) must not double every line.
        root.removeHandler(_installed_handler)
    handler: logging.Handler
    if console is not None:
        handler = log_handler(console)
    elif (stream or sys.stderr).isatty():
        from rich.console import Console

        handler = log_handler(Console(file=stream or sys.stderr))
    else:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        )
    handler.addFilter(_NotFileOnly())
    root.addHandler(handler)
    _installed_handler = handler
    root.setLevel(logging.INFO)
    # httpx logs every request at INFO; the harness logs what each one meant instead.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("prohost").setLevel(logging.DEBUG if verbose else logging.INFO)
