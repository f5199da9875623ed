"""Tests of engine/ledger/: the sqlite ledger's steps, schema and crashes, its group
commit and writer thread, the prune, and the fault-point matrix of its durable steps."""
