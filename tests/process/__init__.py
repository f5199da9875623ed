"""Tests that run the harness as a real ``python -m prohost agent run`` subprocess and
kill, signal or stall it (docs/protocol.md §7 restart, §9): helpers in tests/kits/process.py."""
