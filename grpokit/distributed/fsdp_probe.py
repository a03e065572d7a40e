"""A probe for tests and benchmarks: how many bytes of full (all-gathered) parameters an FSDP2-sharded model holds at
once on this rank. It wraps FSDP2's private ``FSDPParamGroup`` methods (torch 2.13's layout), so it measures, it
does not run in training."""

from __future__ import annotations

import torch


class GatheredBytes:
    """The peak, over a block, of the full (all-gathered) parameter bytes this rank holds at once: FSDP's
    ``FSDPParamGroup.unshard``, ``wait_for_unshard`` and ``reshard`` are wrapped to recount the units gathered (or
    being gathered) after each call."""

    def __init__(self, model: torch.nn.Module):
        from torch.distributed.fsdp import FSDPModule

        self.groups = {  # unit name ("" for the root): its parameter group
            name: module._get_fsdp_state()._fsdp_param_group
            for name, module in model.named_modules()
            if isinstance(module, FSDPModule)
        }
        self.peak = self.at_start = None

    @property
    def sizes(self) -> dict[str, int]:
        """Each unit's full parameter bytes, in the dtype it gathers in (a MixedPrecisionPolicy's param_dtype once
        the model has run forward, else the shards')."""
        return {
            name: sum(
                p._orig_size.numel() * (getattr(p, "param_dtype", None) or p.sharded_param.dtype).itemsize
                for p in group.fsdp_params
            )
            for name, group in self.groups.items()
        }

    def live(self) -> int:
        """Full parameter bytes held now: the units gathered or being gathered."""
        sizes = self.sizes
        return sum(sizes[name] for name, g in self.groups.items() if g.is_unsharded or g._all_gather_result is not None)

    def _note(self) -> None:
        self.peak = max(self.peak, self.live())

    def __enter__(self):
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        self.originals = {n: getattr(FSDPParamGroup, n) for n in ("unshard", "wait_for_unshard", "reshard")}
        for name, original in self.originals.items():

            def wrapped(group, *args, _original=original, **kw):
                out = _original(group, *args, **kw)
                self._note()
                return out

            setattr(FSDPParamGroup, name, wrapped)
        self.at_start = self.peak = self.live()
        return self

    def __exit__(self, *exc):
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        for name, original in self.originals.items():
            setattr(FSDPParamGroup, name, original)
