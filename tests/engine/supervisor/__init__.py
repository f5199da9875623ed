"""Tests of engine/supervisor/ (docs/protocol.md §3, §7 restart, §9): admission (never
503 for a known run), its fuzzing, and recovery at a restart and during a drain."""
