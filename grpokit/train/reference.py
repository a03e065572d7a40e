"""The frozen reference policy of the KL penalty.

A full copy of the initial policy; with LoRA, the policy with its adapters disabled (no copy).
Optional resync (TR-DPO style, as in TRL's ``sync_ref_model``):
pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref every ``ref_model_sync_steps``.
"""

from __future__ import annotations

import contextlib
import copy

import torch


class Reference:
    def __init__(self, policy: torch.nn.Module, use_adapters: bool):
        self.policy = policy
        self.use_adapters = use_adapters
        self.model = None
        if not use_adapters:
            self.model = copy.deepcopy(policy).eval()
            self.model.requires_grad_(False)

    @contextlib.contextmanager
    def active(self):
        """Yields the module to run as the reference."""
        if self.use_adapters:
            with self.policy.disable_adapter():
                yield self.policy
        else:
            yield self.model

    @torch.no_grad()
    def sync(self, alpha: float) -> None:
        """pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref, parameter by parameter.

        Not with LoRA: there the reference is the frozen base under the adapters, with no weights of its own.
        """
        if self.use_adapters:
            raise ValueError(
                "ref_model_sync_steps is not supported with LoRA: the reference is the base model itself; set "
                "ref_model_sync_steps: 0."
            )
        for ref_p, p in zip(self.model.parameters(), self.policy.parameters()):
            ref_p.mul_(1.0 - alpha).add_(p.detach().to(ref_p.dtype), alpha=alpha)

    def state_dict(self) -> dict | None:
        return None if self.model is None else self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state)
