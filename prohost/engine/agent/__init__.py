"""The agent's child process: spawn, output, environment, /proc identity; the brains."""
