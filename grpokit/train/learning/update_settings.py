"""The update's batch settings (:mod:`grpokit.train.learning.learner`): keys of the ``optim`` section, which is
assembled from this class; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from grpokit.errors import require


@dataclass
class UpdateSettings:
    """How a step's completions are cut into micro- and mini-batches, and the gradient clip."""

    max_grad_norm: float = 1.0
    """Gradient clipping norm; 0 = off."""
    per_device_train_batch_size: int = 8
    """Completions per micro-batch on each process."""
    backward_chunk_rows: int | None = None
    """Rows per forward and backward pass within a micro-batch (its loss, normalisation and optimizer step unchanged):
    fewer keep fewer activations for the backward, at some speed. null = the whole micro-batch, or fewer rows when
    the run would not fit in the memory free (grpokit.compose.memory.update_chunk_rows)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step; completions per optimizer step = this x per_device_train_batch_size x
    processes."""
    num_mini_batches: int = 1
    """Optimizer steps per generation batch (per num_iterations pass): a step samples this many optimizer steps'
    completions and cuts them in order into mini-batches, one optimizer step each (TRL: steps_per_generation = this
    x gradient_accumulation_steps)."""

    def check(self) -> None:
        require(
            self.per_device_train_batch_size >= 1,
            f"per_device_train_batch_size={self.per_device_train_batch_size} must be >= 1.",
        )
        require(
            self.backward_chunk_rows is None or self.backward_chunk_rows >= 1,
            f"backward_chunk_rows={self.backward_chunk_rows} must be >= 1, or null to choose it from the model's size.",
        )
        require(
            self.gradient_accumulation_steps >= 1,
            f"gradient_accumulation_steps={self.gradient_accumulation_steps} must be >= 1.",
        )
        require(self.max_grad_norm >= 0, f"max_grad_norm={self.max_grad_norm} must be >= 0 (0 = no clipping).")
        require(self.num_mini_batches >= 1, f"num_mini_batches={self.num_mini_batches} must be >= 1.")
