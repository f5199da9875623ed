"""Tests of docs/ and of the prose in the code: names that resolve, and the table of
docs/protocol.md sections to tests in docs/protocol.md."""
