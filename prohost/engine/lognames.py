"""The names of the loggers people filter on, in one place: a module that wants to
log a run's progress names the logger here instead of importing the runner for it.

``prohost.harness`` is the supervisor's voice (what happens to the harness and its
runs as a whole); ``prohost.harness.runs`` is one line per run accepted, finished
or failed, which the live panel replaces (it is turned down to warnings while the
panel shows).
"""

from __future__ import annotations

#: The supervisor's parts: admission, recovery, the chores, the status file.
HARNESS = "prohost.harness"
#: One line per run's progress; the panel shows the same and quiets it.
RUNS = "prohost.harness.runs"
