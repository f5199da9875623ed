"""Tests of engine/agent/: the agent's process (spawn, output readers, limits, group
kills, with each poller), finding a previous harness's agent, its environment, and
usage parsed from the CLIs' output and reported by whole runs; brains/ has the brains."""
