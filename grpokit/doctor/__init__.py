"""`grpokit doctor CONFIG`: checks a setup before any training (docs/runs.md, "Checking a setup").

Each check is one line, PASS, WARN, FAIL or SKIP, with what it measured and, on a failure or a warning, the fix. A
FAIL means the run would be meaningless (it could not start, or would learn nothing); the command then exits 1.
The checks build the run as `grpokit train` would (inputs.py: data, columns; the model and engine), sample a few
groups with the configured engine, and measure them (samples.py: token round trips, sampler-learner parity,
rewards, resources); nothing is written.
"""
