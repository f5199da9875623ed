"""Tests of engine/link/ (docs/protocol.md §1–§2): the connection (dial, reconnect,
liveness, oversize frames, rejected credentials) and the beacon (status, heartbeats)."""
