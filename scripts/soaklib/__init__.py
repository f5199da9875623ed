"""The chaos soak behind ``scripts/soak.py`` (issues 10 and 16), split by job:

- :mod:`soaklib.plan`    the deterministic plan from a seed (runs, agent sleeps, faults,
  redeliveries) and its digest;
- :mod:`soaklib.agent`   the stand-in agent the harness runs (records every start);
- :mod:`soaklib.procs`   the server and harness subprocesses, their logs, the /proc scan;
- :mod:`soaklib.driver`  the soak: submits the runs, paces the faults, ends and counts;
- :mod:`soaklib.faults`  each fault, and the signals and kills with the exit each must give;
- :mod:`soaklib.pressure` usage limits on the two accounts, and the home's full disk;
- :mod:`soaklib.verdict` the figures: lost, run twice, bad reports, processes left, crashes.
"""
