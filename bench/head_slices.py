"""The fused LM head's forward over slices of the vocabulary against chunks of rows, at Qwen2.5-0.5B's head.

Both compute log p(tokens) (and optionally the entropy) of m = 2048 positions (one micro-batch of 32 x 64) under a
bf16 [151,936, 896] head without keeping the logits: rows in chunks of 2**22 / V = 27 (each chunk's matmul reads
the whole 272 MB weight) as ``kernels/fused_head.py`` did before, or all rows per slice of 2**22 / m = 2048 vocabulary
entries with an online logsumexp (``_over_vocabulary``, what it does now). Alternating, in one process; prints the
seconds of each run and the largest difference of the log-probs.

    python bench/head_slices.py            # ~2 min on 2 cores, ~1 GB
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from grpokit.kernels import fused_head

M, H, V, CHUNK = 2048, 896, 151_936, fused_head.CHUNK_ELEMENTS


def over_rows(h, w, tokens, with_entropy: bool):
    rows = max(1, CHUNK // V)
    parts = [
        fused_head._over_rows(F.linear(h[s : s + rows], w), tokens[s : s + rows], 1.0, CHUNK, with_entropy)[0]
        for s in range(0, h.size(0), rows)
    ]
    return torch.cat(parts)


def over_vocabulary(h, w, tokens, with_entropy: bool):
    return fused_head._over_vocabulary(h, w, None, tokens, 1.0, CHUNK, with_entropy)[0]


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    h = (torch.randn(M, H, generator=gen) * 0.5).to(torch.bfloat16)
    w = (torch.randn(V, H, generator=gen) * 0.02).to(torch.bfloat16)
    tokens = torch.randint(0, V, (M,), generator=gen)
    seconds: dict[str, list[float]] = {}
    with torch.no_grad():
        diff = (over_rows(h, w, tokens, False) - over_vocabulary(h, w, tokens, False)).abs().max()
        for _ in range(4):
            for entropy in (False, True):
                for name, fn in (("row chunks", over_rows), ("vocabulary slices", over_vocabulary)):
                    t = time.perf_counter()
                    fn(h, w, tokens, entropy)
                    seconds.setdefault(f"{name}, entropy {entropy}", []).append(time.perf_counter() - t)
    print(f"largest log-prob difference: {float(diff):.2e}")
    for key, values in seconds.items():
        print(f"{key:<36}" + " ".join(f"{v:6.2f}" for v in values) + " s")


if __name__ == "__main__":
    main()
