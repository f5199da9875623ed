"""Tests of the top-level modules every part uses: $PROHOST_HOME (home.py: credentials,
endpoints, the instance lock, pairing), the atomic writer (files.py), the log file
(logfile.py) and the error helpers (errors.py)."""
