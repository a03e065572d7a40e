"""TRL's token-mask helpers of ``GRPOTrainer`` (``get_high_entropy_mask``, ``get_off_policy_mask``) over
:mod:`grpokit.algos.token_masks`: a base class of :class:`~grpokit.trl.trainer.GRPOTrainer`."""

from __future__ import annotations

import torch

from grpokit.algos.token_masks import high_entropy_mask, off_policy_sequence_mask

_PADDING = -1e9  # pads masked entropies (>= 0) to the same length on every process before a gather


class TokenMasks:
    """TRL's mask helpers; ``get_high_entropy_mask`` reads only ``self.accelerator``."""

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        """TRL's helper (``algos.token_masks.high_entropy_mask``) over every process's masked entropies."""
        accelerator = self.accelerator

        def gather(values: torch.Tensor) -> torch.Tensor:
            everyone = accelerator.gather(accelerator.pad_across_processes(values, dim=0, pad_index=_PADDING))
            return everyone[everyone != _PADDING]  # entropies are >= 0, so the padding is told apart

        return high_entropy_mask(entropies, mask, threshold, gather)

    @staticmethod
    def get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold):
        """TRL's helper (``algos.token_masks.off_policy_sequence_mask``): [N, 1]."""
        return off_policy_sequence_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )
