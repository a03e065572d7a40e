"""The policy's forward under autocast against the cast-once Linears (``Kernels.cast_linears``) and the reference's
pre-cast forward, alternately, in one process.

Builds bench/vs_trl.py's ``qwen0.5b`` model (Qwen2.5-0.5B's widths: hidden 896, 14 / 2 KV heads, MLP 4,864) with
``--layers`` layers and a ``--vocab`` vocabulary (random init), one micro-batch of 4 prompts x 8 completions
(32-token prompts, 64 completion tokens), bf16 autocast, and times per round, variant after variant:

- ``autocast``: the policy's forward with autograd as the learner runs it today (``completion_logprobs`` with
  entropy in an autocast region: each float32 weight cast at its first call in the region), then the backward of
  a GRPO-shaped loss;
- ``cast``: the same inside ``Kernels.cast_linears`` opened for the pass (one step: the casts made in the pass);
- ``cast_warm``: the same with the casts already made (a later micro-batch or optimizer iteration of the step,
  or after the old-policy pass);
- ``reference``: the no-grad forward of a frozen copy whose Linears are stored in bf16 (the reference pass);
- ``old_autocast``, ``old_cast_warm``, ``old_packed_warm``: the no-grad forward of the policy (old-policy
  log-probs) today, from the kept casts, and from kept oneDNN-packed casts.

Prints each round, then medians and ratios to ``autocast`` (forward) and to ``old_autocast``; the gradients and
log-probs of ``cast`` are compared with ``autocast``'s. Simulate an AVX2-only CPU with
``ONEDNN_MAX_CPU_ISA=AVX2 GRPOKIT_CPU_CAPS=avx2`` (bf16 matmuls then run without oneDNN's bf16 kernels).

    python bench/policy_weight_casts.py --layers 4 --vocab 32000 --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import backward_ab  # the bench's model and batch
import vs_trl

VARIANTS = ("autocast", "cast", "cast_warm", "reference", "old_autocast", "old_cast_warm", "old_packed_warm")


def run(model, batch, advantages, kernels, *, grad: bool, cast: str | None):
    """(forward s, backward s or 0, log-probs, grads or None) of one pass; ``cast``: None, "cold" or "warm"."""
    import torch

    from grpokit.train.learning.policy_logprobs import completion_logprobs

    for p in model.parameters():
        p.grad = None
    block = kernels.cast_linears(model) if cast else contextlib.nullcontext()
    with torch.set_grad_enabled(grad), block:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logprobs, _ = completion_logprobs(model, batch, 1.0, with_entropy=grad, kernels=kernels)
        t1 = time.perf_counter()
        if not grad:
            return t1 - t0, 0.0, logprobs, None
        loss = -(logprobs.float() * advantages[:, None] * batch.completion_mask).sum() / batch.completion_mask.sum()
        loss.backward()
    t2 = time.perf_counter()
    grads = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad) for n, p in model.named_parameters()}
    return t1 - t0, t2 - t1, logprobs.detach(), grads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4, help="layers of the qwen0.5b-wide model (default 4 of 24)")
    p.add_argument("--vocab", type=int, default=32_000, help="vocabulary (default 32,000; Qwen2.5's is 151,936)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of every variant, alternating (default 5)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--variants", default=",".join(VARIANTS), help="a comma-separated subset (autocast always runs)")
    a = p.parse_args()
    import dataclasses

    import torch

    from grpokit.kernels import Kernels
    from grpokit.kernels.selection import KernelState
    from grpokit.machine.cpu_caps import cpu_caps, describe

    torch.set_num_threads(a.threads)
    caps = cpu_caps()
    print(
        f"CPU {caps.model}: {describe(caps)} (GRPOKIT_CPU_CAPS={caps.forced}); ONEDNN_MAX_CPU_ISA="
        f"{os.environ.get('ONEDNN_MAX_CPU_ISA')}; {a.threads} threads; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    vs_trl.MODELS["qwen0.5b"] = dict(vs_trl.MODELS["qwen0.5b"], vocab_size=a.vocab)
    model = backward_ab.build(a.layers, torch.float32)
    batch, advantages = backward_ab.make_batch(a.vocab, 4, vs_trl.PROMPT_TOKENS, 64)
    kernels = Kernels.select(torch.device("cpu"), torch.bfloat16, caps)
    warm = dataclasses.replace(kernels, state=KernelState())  # its casts kept across rounds (below)
    packed = dataclasses.replace(kernels, pack_linear_casts=True, state=KernelState())
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    kernels.store_reference(reference)
    variants = {
        "autocast": lambda: run(model, batch, advantages, kernels, grad=True, cast=None),
        "cast": lambda: run(model, batch, advantages, kernels, grad=True, cast="cold"),
        "cast_warm": lambda: run(model, batch, advantages, warm, grad=True, cast="warm"),
        "reference": lambda: run(reference, batch, advantages, kernels, grad=False, cast=None),
        "old_autocast": lambda: run(model, batch, advantages, kernels, grad=False, cast=None),
        "old_cast_warm": lambda: run(model, batch, advantages, warm, grad=False, cast="warm"),
        "old_packed_warm": lambda: run(model, batch, advantages, packed, grad=False, cast="warm"),
    }
    wanted = {"autocast", *a.variants.split(",")}
    variants = {name: fn for name, fn in variants.items() if name in wanted}
    times = {name: ([], []) for name in variants}
    with warm.state.linear_casts.reuse(), packed.state.linear_casts.reuse():  # the warm variants' kept casts
        for rnd in range(a.rounds + 1):  # round 0 warms up (first touch, oneDNN's kernels, the kept casts)
            base = None
            for name, fn in variants.items():
                fwd, bwd, logprobs, grads = fn()
                if rnd == 0:
                    continue
                times[name][0].append(fwd)
                times[name][1].append(bwd)
                note = ""
                if name == "autocast":
                    base = (logprobs, grads)
                elif name == "cast":
                    lp = float((logprobs.float() - base[0].float()).abs().max())
                    g = max(
                        float((grads[k] - base[1][k]).abs().max() / base[1][k].abs().max().clamp(min=1e-30))
                        for k in grads
                    )
                    note = f"  logprob max|diff| {lp:.2e}, grad max|diff|/max {g:.2e}"
                print(
                    f"round {rnd} {name:<16} forward {fwd:6.3f} s  backward {bwd:6.3f} s{note}  "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
                del grads
    med = {name: (statistics.median(f), statistics.median(b)) for name, (f, b) in times.items()}
    print(
        f"\nmedians of {a.rounds} rounds (forward / backward s), ratio of the forward to autocast's / old_autocast's:"
    )
    for name, (f, b) in med.items():
        base = med.get("old_autocast" if name.startswith("old_") else "autocast", (f, b))[0]
        print(f"  {name:<16} {f:6.3f} / {b:6.3f}  forward ratio {f / base:.2f}")
    if "reference" in med:
        over = [f"{n} {med[n][0] / med['reference'][0]:.2f}" for n in ("autocast", "cast", "cast_warm") if n in med]
        print(f"policy forward (autograd) over the reference's: {', '.join(over)}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
