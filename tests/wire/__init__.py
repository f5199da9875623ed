"""Tests of prohost/wire/ and of what the harness says on the wire (docs/protocol.md §2–§3):
the order of intake's faults, every ack status over the real socket, hostile frames
and bodies, and the reader fuzzed."""
