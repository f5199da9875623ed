"""Whole-harness tests that belong to no one room: a run end to end, faults inside a
run, secrets kept from logs, argv, environments and files, a hung disk outside the
ledger, the waiters' wake-ups, and the real agent CLIs."""
