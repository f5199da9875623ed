"""Tests of engine/report/ (docs/protocol.md §7–§8): the reporter's retries and bounds, what
it sends through, the outbox's clock, the timeline's batches, and reports past their
window through whole runs."""
