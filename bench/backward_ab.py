"""The learner's backward with one kernel choice against another, alternately, in one process.

Builds bench/vs_trl.py's ``qwen0.5b`` model (Qwen2.5-0.5B's widths, vocabulary 151,936) with ``--layers`` of its
24 layers, one micro-batch of 4 prompts x 8 completions (32-token prompts, 64 completion tokens, as the bench),
and times, for each variant in turn and for ``--reps`` rounds, the policy forward (``completion_logprobs`` with
entropy, as the learner) and the backward of a GRPO-shaped loss (sum of advantage x log-prob) with the
gradients of the previous repetition freed (as ``zero_grad(set_to_none=True)`` does). Variants:

- ``new``: ``Kernels.select`` for this CPU (``GRPOKIT_CPU_CAPS`` restricts it);
- ``no_<flag>``: the same with one learner kernel turned to its plain version (``fused_head``,
  ``sparse_embedding_grad``, ``small_attention``, ``lean_mlp``, ...; ``no_<flag>+<flag>`` for several);
- ``head@<commit>``: the fused head's module as it was at ``<commit>`` (read with ``git show``), the rest unchanged.

Simulate an AVX2-only CPU on a bigger one with::

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 GRPOKIT_CPU_CAPS=avx2 \\
        python bench/backward_ab.py --layers 2 --variants new,no_sparse_embedding_grad,no_fused_head

Prints each repetition's times and, per variant, the median and its ratio to the first variant; the
gradients of every variant are compared with the first's (max abs difference), since a faster path must
give the same numbers. Ratios are in-run (alternating variants see the same load); absolute times are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # the benchmark's model shapes


def head_at(commit: str):
    """The fused head's module as it was at ``commit``, loaded under its own name."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{commit}:grpokit/kernels/fused_head.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"fused_head_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"fused_head_{commit}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OldHeadKernels:
    """A Kernels whose head_logprobs runs an older fused-head module (everything else delegated)."""

    def __init__(self, kernels, module):
        self._kernels, self._module = kernels, module

    def __getattr__(self, name):
        return getattr(self._kernels, name)

    def head_logprobs(self, hidden, weight, bias, tokens, temperature, with_entropy):
        return self._module.fused_head_logprobs(hidden, weight, bias, tokens, temperature, with_entropy)


def build(layers: int, dtype):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    fields = dict(vs_trl.MODELS["qwen0.5b"], num_hidden_layers=layers)
    config = Qwen2Config(**fields, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(dtype)
    model.train()
    return model


def make_batch(vocab: int, prompts: int, prompt_tokens: int, completion_tokens: int):
    import torch

    from grpokit.train.learning.policy_logprobs import Batch

    g = torch.Generator().manual_seed(1)
    n = prompts * vs_trl.G
    completion_ids = torch.randint(3, vocab, (n, completion_tokens), generator=g)
    lengths = torch.randint(completion_tokens // 2, completion_tokens + 1, (n,), generator=g)
    lengths[0] = completion_tokens
    mask = (torch.arange(completion_tokens)[None] < lengths[:, None]).float()
    prompt_ids = torch.randint(3, vocab, (prompts, prompt_tokens), generator=g)
    return Batch(
        completion_ids=completion_ids,
        completion_mask=mask,
        group_index=torch.arange(n) // vs_trl.G,
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
    ), torch.randn(n, generator=g)


def variant_kernels(name: str, base):
    if name == "new":
        return base
    if name.startswith("no_"):
        return dataclasses.replace(base, **dict.fromkeys(name[3:].split("+"), False))  # no_a+b: both plain
    if name.startswith("head@"):
        return OldHeadKernels(base, head_at(name[5:]))
    raise SystemExit(f"unknown variant {name!r}: new, no_<kernel flag>, head@<commit>")


def one(model, batch, advantages, kernels):
    """(forward s, backward s, grads) of one learner-shaped forward + backward."""

    import torch

    from grpokit.train.learning.policy_logprobs import completion_logprobs

    for p in model.parameters():
        p.grad = None
    t0 = time.perf_counter()
    dtype = kernels.autocast_dtype  # --autocast: the forward under it, the backward outside, as the learner runs them
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        logprobs, _ = completion_logprobs(model, batch, 1.0, with_entropy=True, kernels=kernels)
    loss = -(logprobs * advantages[:, None] * batch.completion_mask).sum() / batch.completion_mask.sum()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    grads = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad) for n, p in model.named_parameters()}
    return t1 - t0, t2 - t1, grads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2, help="layers of the qwen0.5b model (default 2 of 24)")
    p.add_argument("--variants", default="new,no_sparse_embedding_grad,no_fused_head,no_small_attention")
    p.add_argument("--reps", type=int, default=4, help="rounds of every variant, alternating (default 4)")
    p.add_argument("--prompts", type=int, default=4, help="prompts of 8 completions per pass (default 4: 32 rows)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument(
        "--autocast",
        action="store_true",
        help="float32 weights, the forward under bf16 autocast (the learner's way on a bf16 CPU)",
    )
    a = p.parse_args()
    import torch

    from grpokit.kernels import Kernels
    from grpokit.machine.cpu_caps import cpu_caps, describe

    torch.set_num_threads(a.threads)
    caps = cpu_caps()
    print(
        f"CPU {caps.model}: {describe(caps)} (GRPOKIT_CPU_CAPS={caps.forced}); torch kernels "
        f"{torch.backends.cpu.get_cpu_capability()}; ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA')}; "
        f"{a.threads} threads; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    dtype = getattr(torch, a.dtype)
    model = build(a.layers, dtype)
    batch, advantages = make_batch(model.config.vocab_size, a.prompts, vs_trl.PROMPT_TOKENS, 64)
    base = Kernels.select(torch.device("cpu"), torch.bfloat16 if a.autocast else None, caps)
    names = a.variants.split(",")
    variants = {name: variant_kernels(name, base) for name in names}
    times = {name: ([], []) for name in names}
    reference = None
    one(model, batch, advantages, base)  # warm-up: first-touch of the gradients, oneDNN's kernel creation
    for rep in range(a.reps):
        for name in names:
            fwd, bwd, grads = one(model, batch, advantages, variants[name])
            times[name][0].append(fwd)
            times[name][1].append(bwd)
            if reference is None:
                reference = {k: v.clone() for k, v in grads.items()}
            diff = max(float((grads[k] - reference[k]).abs().max()) for k in reference)
            print(
                f"rep {rep + 1} {name:<28} forward {fwd:7.2f} s  backward {bwd:7.2f} s  grad max|diff| {diff:.2e}  "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            del grads
    first = names[0]
    b0 = statistics.median(times[first][1])
    f0 = statistics.median(times[first][0])
    print(f"\nmedians of {a.reps}, ratio to {first}:")
    for name in names:
        f, b = statistics.median(times[name][0]), statistics.median(times[name][1])
        print(f"  {name:<28} forward {f:7.2f} s ({f / f0:.2f})  backward {b:7.2f} s ({b / b0:.2f})")


if __name__ == "__main__":
    main()
