"""What the learner's forward saves for the backward, by the source line that saved it, per kernel choice.

Builds bench/backward_ab.py's model (Qwen2.5-0.5B's widths with ``--layers`` of its 24 layers) and batch (4 prompts x
8 completions, 32-token prompts, 64 completion tokens), runs the learner's forward (``completion_logprobs`` with
entropy, float32 without autocast, as backward_ab.py) once per variant under autograd's saved-tensor hooks, and
prints the bytes saved (each storage once, parameters left out), in total and by the line of code that saved them.
Variants as in backward_ab.py: ``new`` (``Kernels.select`` for this CPU) or ``no_<flag>`` (one learner kernel
turned to its plain version), e.g.::

    python bench/saved_activations.py --layers 2 --variants new,no_lean_norm,no_small_attention

These are the saved activations of the memory ledger (the estimate of ``grpokit.memory.estimate``),
counted exactly instead of estimated.
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import backward_ab


def saved_by_line(model, batch, kernels) -> collections.Counter:
    """Bytes saved for the backward by the learner's forward, by (file:line, shape) of the op that saved them."""
    import torch

    from grpokit.train.learning.policy_logprobs import completion_logprobs

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    lines: collections.Counter = collections.Counter()

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() in params or storage.data_ptr() in seen:
            return t
        seen.add(storage.data_ptr())
        caller = [f for f in traceback.extract_stack()[:-1] if "torch/autograd" not in f.filename][-1]
        where = f"{caller.filename.split('site-packages/')[-1].split('grpokit/')[-1]}:{caller.lineno}"
        lines[(where, tuple(t.shape))] += storage.nbytes()
        return t

    autocast = torch.autocast("cpu", dtype=kernels.autocast_dtype, enabled=kernels.autocast_dtype is not None)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        completion_logprobs(model, batch, 1.0, with_entropy=True, kernels=kernels)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--variants", default="new", help="comma-separated: new, no_<kernel flag>")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--top", type=int, default=12, help="lines printed per variant")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--bf16",
        action="store_true",
        help="under bf16 autocast, as the learner on a bf16 CPU (the weights' casts autocast keeps are counted too)",
    )
    args = p.parse_args()

    import torch

    from grpokit.kernels import Kernels

    torch.set_num_threads(args.threads)
    model = backward_ab.build(args.layers, torch.float32)
    prompt = backward_ab.vs_trl.PROMPT_TOKENS
    batch, _ = backward_ab.make_batch(model.config.vocab_size, args.prompts, prompt, 64)
    base = Kernels.select(torch.device("cpu"), torch.bfloat16 if args.bf16 else None)
    how = "bf16 autocast" if args.bf16 else "float32"
    print(f"{args.layers} layers, {how}, {len(batch)} rows of {prompt}-token prompts and up to 64 completion tokens")
    totals = {}
    for name in args.variants.split(","):
        lines = saved_by_line(model, batch, backward_ab.variant_kernels(name, base))
        totals[name] = sum(lines.values())
        print(f"{name}: {totals[name] / 2**20:,.1f} MiB saved, {totals[name] / args.layers / 2**20:,.1f} per layer")
        for (where, shape), size in lines.most_common(args.top):
            print(f"  {size / 2**20:9.1f} MiB  {where}  {list(shape)}")
    first = next(iter(totals))
    for name, total in totals.items():
        print(f"saved_mib_{name}={total / 2**20:.1f} ratio_to_{first}={total / totals[first]:.3f}")


if __name__ == "__main__":
    main()
