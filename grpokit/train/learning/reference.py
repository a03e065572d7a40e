"""The frozen reference policy of the KL penalty.

A full copy of the initial policy; with LoRA, the policy with its adapters disabled (no copy). The copy
may be stored in bf16 (``ref_model_dtype: bfloat16``, :meth:`Reference.store_in`).
Optional resync (TR-DPO style, as in TRL's ``sync_ref_model``):
pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref every ``ref_model_sync_steps``.
"""

from __future__ import annotations

import contextlib
import copy
import functools

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

    def store_in(self, dtype: torch.dtype) -> int:
        """Store the copy's floating-point parameters that are not in ``dtype`` in ``dtype``; returns how many.

        Each module casts its own parameters back to their former dtype as it runs (forward hooks) and
        drops the casts when it returns, so the pass computes as before, on weights rounded to ``dtype``,
        holding one module's casts at a time. Code that reads a weight outside its module's call (the
        fused LM head) gets the stored ``dtype`` and casts it itself.
        """
        former: dict[int, torch.dtype] = {}
        for module in self.model.modules():
            own = [p for p in module.parameters(recurse=False) if p.is_floating_point() and p.dtype != dtype]
            own += [p for p in module.parameters(recurse=False) if id(p) in former]  # tied: stored already
            if not own:
                continue
            for p in own:
                if id(p) not in former:
                    former[id(p)] = p.dtype
                    p.data = p.data.to(dtype)
            restore = {id(p): p.data for p in own}
            module.register_forward_pre_hook(functools.partial(_cast, own, former))
            module.register_forward_hook(functools.partial(_uncast, own, restore), always_call=True)
        return len(former)

    def state_dict(self) -> dict | None:
        return None if self.model is None else self.model.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state)


def _cast(params: list, dtypes: dict, module, args) -> None:
    """Forward pre-hook of :meth:`Reference.store_in`: the module's stored parameters in their former dtypes."""
    with torch.inference_mode(False):  # a plain tensor, whether or not the pass runs in inference mode
        for p in params:
            p.data = p.data.to(dtypes[id(p)])


def _uncast(params: list, stored: dict, module, args, output) -> None:
    """Forward hook of :meth:`Reference.store_in`: the stored parameters back (the casts are dropped)."""
    for p in params:
        p.data = stored[id(p)]
