"""``LoopSpec``: the training loop's own settings (:mod:`grpokit.train.loop`), built from the config by
:func:`grpokit.compose.specs.loop_spec` and carried in the built Run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpokit.models.hub import HubSpec


@dataclass(frozen=True)
class LoopSpec:
    """The loop's own settings, built once by :func:`grpokit.compose.specs.loop_spec`. ``algo``: the algorithm's
    section, read by its advantages; ``rewards_on_main``: Ray reward workers (rank 0 scores every rank's rows);
    ``save_at_end``: save_strategy is not no; ``token_values``: the per-token values the store keeps
    (``store.settings.StoreSettings.kept_token_values``; empty: none); ``log_completions`` / ``log_multimodal``: the
    tracking settings GRPOTrainer's ``_logs`` follows."""

    model_name_or_path: str | None
    dtype: str
    seed: int
    algorithm: str
    algo: Any  # the algorithm's own section, passed through to its advantages
    num_generations: int
    max_steps: int
    completions_per_step: int
    prompt_column: str
    ref_model_sync_steps: int
    ref_model_mixup_alpha: float
    logging_steps: int
    merge_on_save: bool
    eval_dataset: Any
    log_completions: bool  # TRL's trainer._logs is filled from each step's records (grpokit.trl)
    log_multimodal: bool  # ... with each prompt's images
    rewards_on_main: bool = False
    save_at_end: bool = True
    hub: HubSpec | None = None
    token_values: tuple[str, ...] = ()
