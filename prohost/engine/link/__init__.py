"""The socket to the server (§1–§2): dial, hello, reader, liveness; the heartbeat beacon."""
