"""One run (§5): its steps in order, its attempts, its prompt, how it is held."""
