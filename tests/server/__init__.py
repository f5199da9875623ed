"""Tests of prohost/server/, the reference server (docs/protocol.md §11): pairing, the
socket and its deliveries, the run API and ``prohost send``, its delivery window and
timers, and the soak's fault hooks."""
