"""Tests of engine/run/ (docs/protocol.md §5–§6): executing one run, its prompt and the
chat's words in it, the session a lane keeps, the working folder, queued bodies, and
cancellation."""
