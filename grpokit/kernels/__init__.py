"""grpokit's fast paths (kernels), one module each, behind one choice per run (:class:`Kernels`).

    selection.py       Kernels: which version of each op a run uses, chosen once; KernelState
    fused_decoder.py   decoding steps of Llama-family models on fused, packed weights
    packed_linear.py   Linear weights packed once for oneDNN (CPU inference)
    kv_cache.py        a KV cache allocated once per generation
    attention.py       plain attention for the learner's small CPU calls
    fused_head.py      LM head + log-softmax fused (chunked), WeightCasts
    plain_head.py      whether a model's logits are a plain Linear head over its decoder
    sparse_embedding.py  sparse token-embedding gradients
    linear_storage.py  a frozen model's Linear weights in the autocast dtype
    allocator.py       keep_freed_memory: an opt-in allocator setting for programs that own their process

The rollout engine and the learner use the kernels through :class:`Kernels` only; ``grpokit.machine.cpu_caps``
is the probe the choice and the kernels ask. Nothing here imports ``grpokit.train`` or ``grpokit.rollout``.
"""

from grpokit.kernels.allocator import keep_freed_memory
from grpokit.kernels.selection import Kernels, KernelState

__all__ = ["KernelState", "Kernels", "keep_freed_memory"]
