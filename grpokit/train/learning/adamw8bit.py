"""bitsandbytes' AdamW8bit (Dettmers et al. 2022), with the CPU step of a large parameter run over slices of it.

Both moments are 8-bit codes with a float32 scale per block of 256 values (parameters under 4096 values keep
float32 moments). bitsandbytes' CPU step dequantises a parameter's two moments to float32, updates, and quantises
them again: about five float32 copies of the parameter at a time, 2.7 GB for a 152k x 896 embedding, which would
take back most of what the 8-bit moments save. Every operation of that step is elementwise or per block, so
running it over slices of ``SLICE_VALUES`` (a whole number of blocks) gives the same numbers with five copies of a
slice. Imported only when ``optimizer`` names an 8-bit AdamW (bitsandbytes is the qlora extra).
"""

from __future__ import annotations

import bitsandbytes
import bitsandbytes.functional as bnb_functional
import torch

BLOCK = 256  # values per scale of bitsandbytes' blockwise 8-bit moments
SLICE_VALUES = 2**22  # values per slice of a CPU step (16 MiB in float32); a multiple of BLOCK


class AdamW8bit(bitsandbytes.optim.AdamW8bit):
    """``bitsandbytes.optim.AdamW8bit``; on CPU, a parameter of more than ``SLICE_VALUES`` values with 8-bit moments
    is updated slice by slice (module docstring)."""

    def update_step(self, group, p, gindex, pindex):
        state = self.state[p]
        if p.device.type != "cpu" or state["state1"].dtype != torch.uint8 or p.numel() <= SLICE_VALUES:
            return super().update_step(group, p, gindex, pindex)
        p.data = p.data.contiguous()
        p.grad = p.grad.contiguous()
        config = self.get_config(gindex, pindex, group)
        state["step"] += 1
        betas = config["betas"]
        values = [p.grad.view(-1), p.data.view(-1), state["state1"].view(-1), state["state2"].view(-1)]
        for start in range(0, p.numel(), SLICE_VALUES):
            part = slice(start, start + SLICE_VALUES)
            blocks = slice(start // BLOCK, -(-(start + SLICE_VALUES) // BLOCK))
            grad, param, state1, state2 = (t[part] for t in values)
            bnb_functional.optimizer_update_8bit_blockwise(
                self.optimizer_name,
                grad,
                param,
                state1,
                state2,
                betas[0],
                betas[1],
                betas[2] if len(betas) >= 3 else 0.0,
                config.get("alpha", 0.0),
                config["eps"],
                state["step"],
                config["lr"],
                state["qmap1"],
                state["qmap2"],
                state["absmax1"][blocks],
                state["absmax2"][blocks],
                config["weight_decay"],
                gnorm_scale=1.0,
                skip_zeros=config["skip_zeros"],
            )
