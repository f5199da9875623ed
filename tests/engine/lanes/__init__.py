"""Tests of engine/lanes/ (docs/protocol.md §4): the pure lane queue and the scheduler, and
lanes, the concurrency limit and slots through whole runs."""
