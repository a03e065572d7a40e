"""Fault injection: runs of the real CLI broken at their edges (two writers, overwrite, damaged files, signals at
step 0 and while saving, a full disk). A package, so that its conftest.py does not take the module name `conftest`
from tests/conftest.py, which the other test folders import (`from conftest import ...`)."""
