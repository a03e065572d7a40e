"""Run: the training loop over a built Run (loop.py, evaluation beside it), grouped by concern: sampling/,
learning/ and rundir/ (the run folder and its checkpoints). Nothing here imports build/, config/ or trl/."""
