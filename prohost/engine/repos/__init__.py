"""--repos: per-lane private worktrees, git, their collection."""
