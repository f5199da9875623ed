"""Tests of engine/agent/brains/: each brain's command line and reading of its CLI's
output (fed recorded and fake CLI output), and brains through whole runs."""
