"""Tests of engine/repos/ (docs/protocol.md §5.1, §7 ``changes``): per-conversation
worktrees, their bounds and unusual repositories, what a run changed, and the
collection of idle worktrees (with ``agent gc``), alone and through whole runs."""
