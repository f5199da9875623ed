"""The outbox's posts (§7–§8): completions with their retry window, timeline rows."""
