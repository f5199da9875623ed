"""Tests of engine/accounts/ (docs/protocol.md §12): the account book, limits read from
the CLIs' output, the gate's waits, fail-over sessions, budgets and today's spend,
alone and through whole runs."""
