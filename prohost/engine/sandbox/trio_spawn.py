"""``trio.lowlevel.open_process``, confined, the cheap way: :func:`open_process`.

trio's own ``open_process`` calls ``subprocess.Popen`` in one of its cached worker
threads, which cannot be confined (the thread lives on and runs other work). This
does what it does (trio's pipes for ``PIPE``, ``Popen`` in a worker thread, a
``trio.Process`` around it) with the ``Popen`` made inside
:meth:`Confinement.spawn_from_a_confined_thread`, so subprocess keeps its vfork path
and no code runs in the child. It leans on two private pieces of trio
(``Process._create`` and the platform's pipe makers, stable since trio 0.22);
``tests/engine/sandbox/test_trio_spawn.py`` fails if a trio upgrade moves them.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import trio
from trio._subprocess_platform import (
    create_pipe_from_child_output,
    create_pipe_to_child_stdin,
)

from prohost.engine.sandbox.confinement import Confinement


async def open_process(confinement: Confinement, command: Sequence[str], *,
                       stdin: int | None = None, stdout: int | None = None,
                       stderr: int | None = None, **options: Any) -> trio.Process:
    """``command`` started confined (``argv_prefix`` added), as trio's ``open_process``.

    Only ``subprocess.PIPE``, ``None`` or a descriptor for each stream (no
    ``STDOUT`` merging). Raises ``OSError`` when the process cannot be started or the
    domain cannot be entered. Cancelled: the spawn is not abandoned (it is quick);
    the cancellation is seen at the next checkpoint after it, and the process it
    started is then the caller's to stop, as with trio's own.
    """
    argv = [*confinement.argv_prefix, *command]
    trio_stdin = trio_stdout = trio_stderr = None
    with ExitStack() as always_cleanup, ExitStack() as cleanup_on_fail:
        if stdin == subprocess.PIPE:
            trio_stdin, stdin = create_pipe_to_child_stdin()
            always_cleanup.callback(os.close, stdin)
            cleanup_on_fail.callback(trio_stdin.close)
        if stdout == subprocess.PIPE:
            trio_stdout, stdout = create_pipe_from_child_output()
            always_cleanup.callback(os.close, stdout)
            cleanup_on_fail.callback(trio_stdout.close)
        if stderr == subprocess.PIPE:
            trio_stderr, stderr = create_pipe_from_child_output()
            always_cleanup.callback(os.close, stderr)
            cleanup_on_fail.callback(trio_stderr.close)
        popen = functools.partial(subprocess.Popen, argv, stdin=stdin, stdout=stdout,
                                  stderr=stderr, **options)
        started = await trio.to_thread.run_sync(
            confinement.spawn_from_a_confined_thread, popen)
        cleanup_on_fail.pop_all()
    return trio.Process._create(started, trio_stdin, trio_stdout, trio_stderr)
