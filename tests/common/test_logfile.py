"""The harness's own log file: rotated by size, private, and never holding the secrets."""

from __future__ import annotations

import logging
import logging.handlers
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.lowlevel

from prohost import logfile
from prohost.logfile import (
    MASK,
    FileLogHandler,
    PrivateRotatingFileHandler,
    add_redaction,
    log_to_file,
    redact,
    wants_file_logging,
)

TOKEN = "tok-0123456789-SECRET"
SECRET = "sec-9876543210-SECRET"


@pytest.fixture(autouse=True)
def clean_prohost_logger() -> Iterator[None]:
    logger = logging.getLogger("prohost")
    level = logger.level
    yield
    for handler in file_handlers():
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(level)


def file_handlers() -> list[FileLogHandler]:
    return [h for h in logging.getLogger("prohost").handlers if isinstance(h, FileLogHandler)]


def written(path: Path) -> str:
    """The log file once every line logged so far is in it (its thread writes it)."""
    for handler in file_handlers():
        assert handler.drain()
    return path.read_text()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_rotation_keeps_at_most_backups_files(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old_umask = os.umask(0)  # the modes must not depend on the umask
    try:
        path = log_to_file(home, max_bytes=2000, backups=3)
        log = logging.getLogger("prohost.test")
        for number in range(400):
            log.info("line %04d %s", number, "x" * 40)
        written(path)
    finally:
        os.umask(old_umask)
    assert path == home / "logs" / "agent.log"
    assert (home / "logs" / "agent.log.1").exists()
    files = sorted(p.name for p in (home / "logs").iterdir())
    assert files == ["agent.log", "agent.log.1", "agent.log.2", "agent.log.3"]
    assert mode(home) == 0o700
    assert mode(home / "logs") == 0o700
    for name in files:
        file = home / "logs" / name
        assert mode(file) == 0o600, name
        assert file.stat().st_size <= 2000
    last = path.read_text().splitlines()[-1]
    assert last.endswith("INFO    prohost.test: line 0399 " + "x" * 40)
    assert (home / "logs" / "agent.log.1").read_text().splitlines()[-1].split()[-2] < "0399"


def test_an_existing_log_is_narrowed_to_0600(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    os.chmod(logs, 0o755)
    (logs / "agent.log").write_text("old line\n")
    os.chmod(logs / "agent.log", 0o644)
    path = log_to_file(tmp_path)
    logging.getLogger("prohost").warning("new line")
    assert written(path).splitlines()[0] == "old line"
    assert mode(logs) == 0o700
    assert mode(path) == 0o600  # appended, not truncated


def test_calling_again_replaces_the_handler(tmp_path: Path) -> None:
    log_to_file(tmp_path)
    path = log_to_file(tmp_path)
    assert len(file_handlers()) == 1
    logging.getLogger("prohost.x").info("once")
    assert written(path).count("once") == 1


def test_level_applies(tmp_path: Path) -> None:
    logging.getLogger("prohost").setLevel(logging.WARNING)
    path = log_to_file(tmp_path, level=logging.DEBUG)
    logging.getLogger("prohost.x").debug("debug line")
    assert "debug line" in written(path)


def test_zero_backups_is_refused(tmp_path: Path) -> None:
    """RotatingFileHandler reads 0 as "never rotate": the unbounded file this exists to stop."""
    with pytest.raises(ValueError, match="at least 1"):
        log_to_file(tmp_path, backups=0)
    with pytest.raises(ValueError, match="at least 1"):
        log_to_file(tmp_path, max_bytes=0)


def test_wants_file_logging() -> None:
    assert wants_file_logging({"PROHOST_LOG": "file"})
    assert not wants_file_logging({})
    assert not wants_file_logging({"PROHOST_LOG": ""})


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError(f"failed with {TOKEN}")
        except RuntimeError as error:
            exc_info = (type(error), error, error.__traceback__)
    return logging.LogRecord("prohost.link", logging.INFO, __file__, 1, msg, args, exc_info)


@pytest.mark.protocol("§1")
def test_redact_masks_message_and_args() -> None:
    masking = redact(TOKEN, SECRET, "")
    record = _record(f"token {TOKEN} in the message, %s and %r in args", SECRET, {"t": TOKEN})
    assert masking.filter(record)
    message = record.getMessage()
    assert TOKEN not in message
    assert SECRET not in message
    assert message == f"token {MASK} in the message, {MASK} and {{'t': '{MASK}'}} in args"
    # Idempotent: a second handler with the same filter sees the same text.
    assert masking.filter(record)
    assert record.getMessage() == message


@pytest.mark.protocol("§1")
def test_redact_masks_tracebacks_and_bad_format_strings() -> None:
    masking = redact(TOKEN)
    record = _record("oops", exc=True)
    masking.filter(record)
    text = logging.Formatter().format(record)
    assert "RuntimeError: failed with" in text
    assert TOKEN not in text

    record = _record("two %s %s but one arg", TOKEN)
    masking.filter(record)
    assert TOKEN not in record.getMessage()


@pytest.mark.protocol("§1")
def test_add_redaction_covers_child_loggers(tmp_path: Path) -> None:
    """On the handler, not the logger: a logger's filter misses its children's records."""
    path = log_to_file(tmp_path)
    masking = add_redaction(TOKEN, SECRET)
    try:
        logging.getLogger("prohost.link.deep").warning("dialing with %s / %s", TOKEN, SECRET)
        text = written(path)
        assert "dialing with" in text
        assert TOKEN not in text
        assert SECRET not in text
    finally:
        for name in ("", "prohost"):
            for handler in logging.getLogger(name).handlers:
                handler.removeFilter(masking)


class HungFile:
    """Stands in for the log file's ``emit``: the listener's writes hang until the
    test releases them; one on the trio (main) thread is recorded and returns, so
    that a harness writing on its own thread fails the test instead of hanging it."""

    def __init__(self, real: Callable[[logging.Handler, logging.LogRecord], None]) -> None:
        self.real = real
        self.release = threading.Event()
        self.entered = threading.Event()
        self.on_main_thread: list[str] = []

    def emit(self, handler: logging.Handler, record: logging.LogRecord) -> None:
        self.entered.set()
        if threading.current_thread() is threading.main_thread():
            self.on_main_thread.append(record.getMessage())
            return
        self.release.wait()
        self.real(handler, record)


@pytest.fixture
def hung_file(monkeypatch: pytest.MonkeyPatch) -> Iterator[HungFile]:
    hung = HungFile(logging.handlers.RotatingFileHandler.emit)

    def emit(handler: logging.Handler, record: logging.LogRecord) -> None:
        hung.emit(handler, record)

    monkeypatch.setattr(PrivateRotatingFileHandler, "emit", emit)
    yield hung
    hung.release.set()


async def test_logging_from_trio_never_waits_for_a_hung_log_file(
    tmp_path: Path, hung_file: HungFile,
) -> None:
    """Issue 16 (4): the daemon's log file on a hung disk must not stall the event
    loop: lines logged from the trio thread are only queued, and written, in order
    and masked, once the disk answers."""
    path = log_to_file(tmp_path)
    masking = add_redaction(TOKEN)
    log = logging.getLogger("prohost.harness")
    try:
        log.warning("first line")
        await trio.to_thread.run_sync(hung_file.entered.wait)  # the file write hangs now
        for number in range(3):
            log.warning("line %d with %s", number, TOKEN)
            await trio.lowlevel.checkpoint()  # the loop goes on
        assert hung_file.on_main_thread == []
        hung_file.release.set()
        text = written(path)
    finally:
        for name in ("", "prohost"):
            for handler in logging.getLogger(name).handlers:
                handler.removeFilter(masking)
    lines = [line.split(": ", 1)[1] for line in text.splitlines()]
    assert lines == ["first line"] + [f"line {n} with {MASK}" for n in range(3)]


def test_closing_writes_the_last_lines(tmp_path: Path) -> None:
    path = log_to_file(tmp_path)
    log = logging.getLogger("prohost.harness")
    for number in range(200):
        log.info("line %03d", number)
    (handler,) = file_handlers()
    logging.getLogger("prohost").removeHandler(handler)
    handler.close()  # as logging.shutdown does at exit, the third signal's included
    assert path.read_text().splitlines()[-1].endswith("line 199")
    assert len(path.read_text().splitlines()) == 200


def test_a_full_queue_drops_lines_and_says_how_many(
    tmp_path: Path, hung_file: HungFile, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Logging never waits for the disk, nor holds unbounded memory for it."""
    monkeypatch.setattr(logfile, "LOG_QUEUE_RECORDS", 2)
    path = log_to_file(tmp_path)
    log = logging.getLogger("prohost.harness")
    log.warning("taken")
    hung_file.entered.wait()  # the listener holds "taken"; the queue is empty
    for number in range(5):
        log.warning("queued %d", number)  # 0 and 1 fit, 2 to 4 are dropped
    hung_file.release.set()
    lines = [line.split(": ", 1)[1] for line in written(path).splitlines()]
    assert lines == ["taken", "3 log line(s) were dropped: the log file was not writable",
                     "queued 0", "queued 1"]
