"""Tests of prohost/engine/: one folder per room (supervisor, link, lanes, run, agent,
accounts, ledger, repos, report, view), and here the engine's own modules
(blocking.py, signals.py)."""
