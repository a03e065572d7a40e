"""Cost of the student's top-k log-probs through the fused head: fused head alone vs fused head + gathered top-k
(forward + backward), CPU float32; run with OMP_NUM_THREADS=1 (docs/distillation.md)."""

import time

import torch

from grpokit.kernels.fused_head import fused_head_logprobs
from grpokit.kernels.gathered_head import gathered_logits

torch.manual_seed(0)
m, H, V, k = 512, 256, 32000, 20
h = torch.randn(m, H, requires_grad=True)
w = torch.nn.Parameter(torch.randn(V, H) * 0.02)
y = torch.randint(0, V, (m,))
ids = torch.randint(0, V, (m, k))


def run(topk):
    lp, _ = fused_head_logprobs(h, w, None, y)
    loss = lp.sum()
    if topk:
        z = gathered_logits(h, w, None, torch.cat([ids, y[:, None]], 1))
        loss = loss + (z[:, :-1] - z[:, -1:] + lp[:, None]).sum()
    loss.backward()
    h.grad = None
    w.grad = None


for topk in (False, True):
    run(topk)
    t = time.perf_counter()
    [run(topk) for _ in range(5)]
    print("topk" if topk else "base", (time.perf_counter() - t) / 5)
print("full logits would be", m * V * 4 / 2**20, "MiB; the gathered rows per chunk", 2**22 * 4 / 2**20, "MiB")
