"""Agent accounts and usage limits (§12): the book, the CLIs' notices, the wait."""
