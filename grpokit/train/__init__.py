"""Training: the GRPO loop, the learner, the reference model, checkpoints, LR schedules."""
