"""Run: the training loop over a built Run (loop.py, evaluation beside it), grouped by concern: experience/ (sampling
and scoring), learning/ (the update), rundir/ (the run folder and its checkpoints) and teacher/ (on-policy
distillation). Nothing here imports compose/, config/ or trl/."""
