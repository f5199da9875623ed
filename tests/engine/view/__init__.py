"""Tests of engine/view/: the panel's pictures and refreshes, and the words people
read about a report."""
