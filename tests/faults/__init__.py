"""Fault injection: runs of the real CLI broken at their edges (two writers, overwrite, damaged files, signals at
step 0 and while saving, a full disk). Shared names come from tests/shared_helpers.py."""
