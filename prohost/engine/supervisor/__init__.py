"""The supervisor's parts: admission (§3), restart recovery (§7), the upkeep chores."""
