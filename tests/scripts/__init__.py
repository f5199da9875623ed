"""Tests of scripts/: the benchmarks' pieces with tiny numbers, and the chaos soak (the
long ones are ``slow``: ``scripts/test -m slow``)."""
