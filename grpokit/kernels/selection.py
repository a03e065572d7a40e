"""The one choice of kernels for a run: which version (fast or plain) of each op the engine and learner use.

:meth:`Kernels.select` decides once per run, from the device, the autocast dtype and the CPU probe
(:func:`grpokit.machine.cpu_caps.cpu_caps`, which ``GRPOKIT_CPU_CAPS`` restricts). The rollout engine and the
learner call the methods below instead of importing or probing the kernels themselves. A flag set to
False gives the plain version of that op: the same numbers (up to float rounding), slower.

The object also holds the run's kernel state (:class:`KernelState`: per-model checks and the LM head's
weight casts), so two runs in one process share nothing.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch

from grpokit.machine.cpu_caps import CpuCaps, cpu_caps
from grpokit.system.processes import is_sharded


class KernelState:
    """What a run's kernels remember: which models passed the fused decoder's and the plain head's
    checks (keyed weakly by model), and the fused head's weight casts (:class:`WeightCasts`)."""

    def __init__(self):
        from grpokit.kernels.cast_linears import LinearCasts
        from grpokit.kernels.fused_head import WeightCasts

        self.linear_casts = LinearCasts()
        self.decoder_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.plain_heads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.weight_casts = WeightCasts()


# Kernels' flags, as grpokit env names them.
FAST_PATHS = {
    "fused_decoder": "fused decoder (Llama, Qwen2, Qwen3, Mistral)",
    "packed_linears": "oneDNN-packed weights for sampling",
    "preallocated_kv_cache": "preallocated KV cache",
    "small_attention": "plain attention for small learner calls",
    "lean_mlp": "gated MLP keeping only its inputs for the backward (float32, and bf16 on CPU)",
    "lean_norm": "RMSNorm keeping only its input for the backward (float32 residual stream)",
    "fused_head": "fused LM head",
    "sparse_embedding_grad": "sparse embedding gradients",
    "reference_in_autocast_dtype": "reference Linear weights in the autocast dtype",
    "cast_once_linears": "policy Linear weights cast to the autocast dtype once per optimizer step",
    "pack_linear_casts": "oneDNN-packed casts for the policy's no-grad passes",
}


@dataclass(frozen=True)
class Kernels:
    """Which version of each op a run uses (True = the fast one), with the callables for it.

    Build it with :meth:`select`; ``dataclasses.replace(kernels, fused_head=False)`` turns one op to its
    plain version (to compare the two, or to rule one out).

    Sampling (:class:`grpokit.rollout.engine.HFRolloutEngine`):
      fused_decoder: decoding steps of Llama-family models on fused, packed weights, CPU only (kernels/fused_decoder.py)
      packed_linears: sampling other models without autocast on oneDNN-packed Linear weights (kernels/packed_linear.py)
      preallocated_kv_cache: a KV cache allocated once per generation (kernels/kv_cache.py)
    Log-prob passes and training (``train.learning.policy_logprobs``, ``train.learning.learner.Learner``):
      small_attention: plain attention for small CPU calls instead of SDPA (kernels/attention.py)
      lean_mlp: Llama-family MLPs saving x, gate and up for the backward, in float32 or under CPU autocast
        (kernels/lean_mlp.py)
      lean_norm: Llama-family RMSNorms saving x and its rsqrt for the backward, on a float32 residual stream with
        or without autocast (kernels/lean_norm.py)
      fused_head: LM head and log-softmax fused, no [N, T, V] float32 logits (kernels/fused_head.py)
      sparse_embedding_grad: a sparse gradient for the token embedding (kernels/sparse_embedding.py)
      reference_in_autocast_dtype: the frozen reference's Linear weights stored in the autocast dtype
        (kernels/linear_storage.py)
      cast_once_linears: under CPU autocast, the policy's Linears compute from one cast of their weights per
        optimizer step, shared by the old-policy pass and every micro-batch (kernels/cast_linears.py; off by
        default: not measured faster yet, docs/performance.md)
      pack_linear_casts: with cast_once_linears, the policy's no-grad passes multiply with oneDNN-packed casts
    """

    autocast_dtype: torch.dtype | None
    fused_decoder: bool
    packed_linears: bool
    preallocated_kv_cache: bool
    small_attention: bool
    lean_mlp: bool
    lean_norm: bool
    fused_head: bool
    sparse_embedding_grad: bool
    reference_in_autocast_dtype: bool
    cast_once_linears: bool = False
    pack_linear_casts: bool = False
    state: KernelState = field(default_factory=KernelState, compare=False, repr=False)

    @classmethod
    def select(
        cls, device: torch.device, autocast_dtype: torch.dtype | None = None, caps: CpuCaps | None = None
    ) -> Kernels:
        """The kernels for a run on ``device`` computing under ``autocast_dtype`` (None: the weights' dtype).

        Fused head, lean MLP and norms, sparse embedding gradient and the preallocated KV cache are plain PyTorch
        ops, used on every device. The fused decoder is tuned for the CPU (it copies the weights into its own
        packed layout and attends in float32 over the whole cache): CPU only; CUDA decodes with the model's own
        forward and SDPA. Packed Linear weights need oneDNN on a CPU that packs
        (``caps.packs``) and no autocast (each weight is packed in its own dtype; under autocast each call
        would cast and pack again). The
        plain attention is for CPU only (its budgets were measured there; other devices keep SDPA's kernels).
        """
        cpu = device.type == "cpu"
        caps = caps if caps is not None else cpu_caps() if cpu else None
        return cls(
            autocast_dtype=autocast_dtype,
            fused_decoder=cpu,  # CPU-tuned: it copies the weights and attends in float32 over the whole cache
            packed_linears=cpu and autocast_dtype is None and caps.packs(torch.float32),
            preallocated_kv_cache=True,
            small_attention=cpu,
            lean_mlp=True,
            lean_norm=True,
            fused_head=True,
            sparse_embedding_grad=True,
            reference_in_autocast_dtype=autocast_dtype is not None,
            # off until measured faster: on AVX-512 without AMX (2026-12-07) no faster than autocast's casts
            # (docs/performance.md); AMX, where the issue saw the policy forward at 3.2x the reference's: unmeasured
            cast_once_linears=False,
            pack_linear_casts=False,
        )

    def in_use(self) -> list[str]:
        """The fast ops this choice uses, by name (``grpokit env`` lists them)."""
        return [text for flag, text in FAST_PATHS.items() if getattr(self, flag)]

    # sampling

    def decoder(self, model: torch.nn.Module, dtype: torch.dtype, rows: int):
        """A fused decoder (:class:`grpokit.kernels.fused_decoder.FusedDecoder`) for ``model`` computing in
        ``dtype`` for about ``rows`` rows, or None: this run does not fuse, or the model is not supported."""
        if not self.fused_decoder or is_sharded(model):  # it copies the weights: never a sharded model's
            return None
        from grpokit.kernels import fused_decoder

        return fused_decoder.fused_decoder(model, dtype, rows, self.state.decoder_checked)

    def sampling_linears(self, model: torch.nn.Module, rows: int, device: torch.device):
        """A block in which ``model``'s Linear layers run on packed weights (see ``packed_linears``), or a no-op."""
        if not self.packed_linears or is_sharded(model):  # packing copies the weights: never a sharded model's
            return contextlib.nullcontext()
        from grpokit.kernels import packed_linear

        return packed_linear.packed_linears(model, None, rows, device)

    def preallocate(self, cache, capacity: int) -> None:
        """Give ``cache`` (a transformers Cache after prefill) room for ``capacity`` positions, if this run does."""
        if self.preallocated_kv_cache:
            from grpokit.kernels import kv_cache

            kv_cache.preallocate(cache, capacity)

    # log-prob passes and training

    def attention(self, model: torch.nn.Module):
        """A block in which ``model`` (on "sdpa") runs the plain small-shape attention, or a no-op."""
        if not self.small_attention:
            return contextlib.nullcontext()
        # imported here: it imports transformers' modeling code, needed only once a model runs
        from grpokit.kernels import attention

        return attention.small_attention(model)

    def mlp(self, model: torch.nn.Module):
        """A block in which ``model``'s Llama-family MLPs keep only their inputs for the backward, or a no-op."""
        if not self.lean_mlp:
            return contextlib.nullcontext()
        from grpokit.kernels import lean_mlp

        return lean_mlp.lean_mlps(model)

    def norms(self, model: torch.nn.Module):
        """A block in which ``model``'s Llama-family RMSNorms keep only their input for the backward, or a no-op."""
        if not self.lean_norm:
            return contextlib.nullcontext()
        from grpokit.kernels import lean_norm

        return lean_norm.lean_norms(model)

    def plain_head(self, model: torch.nn.Module):
        """(decoder, lm_head) for the fused head when ``model`` (called directly, not DDP/FSDP) has a plain
        Linear LM head, else None (also when this run does not fuse the head)."""
        if not self.fused_head:
            return None
        from grpokit.kernels import plain_head

        return plain_head.plain_head(model, self.state.plain_heads)

    def head_logprobs(self, hidden, weight, bias, tokens, temperature: float, with_entropy: bool):
        """(log p(tokens) [m], entropy [m] or None) through the fused head (:func:`fused_head_logprobs`)."""
        from grpokit.kernels.fused_head import fused_head_logprobs

        return fused_head_logprobs(
            hidden, weight, bias, tokens, temperature, with_entropy, casts=self.state.weight_casts
        )

    def reuse_weight_casts(self):
        """A block in which the fused head casts each weight to the autocast dtype once (one optimizer step)."""
        return self.state.weight_casts.reuse()

    def cast_linears(self, model: torch.nn.Module):
        """A block in which ``model``'s float32 Linears, under CPU autocast, compute from casts kept while the
        outermost such block is open (one per weight version; :mod:`grpokit.kernels.cast_linears`), or a no-op."""
        if not self.cast_once_linears or self.autocast_dtype is None or is_sharded(model):
            return contextlib.nullcontext()
        from grpokit.kernels.cast_linears import cast_linears

        return cast_linears(model, self.state.linear_casts, self.autocast_dtype, pack=self.pack_linear_casts)

    def drop_linear_casts(self, *_) -> None:
        """Forget the kept Linear casts (an optimizer step hook: the weights they were made from changed)."""
        self.state.linear_casts.clear()

    def embedding_grad(self, decoder: torch.nn.Module):
        """A block in which ``decoder``'s token embedding gives sparse gradients, or a no-op."""
        if not self.sparse_embedding_grad:
            return contextlib.nullcontext()
        from grpokit.kernels.sparse_embedding import sparse_embedding_grad

        return sparse_embedding_grad(decoder)

    def store_reference(self, model: torch.nn.Module) -> int:
        """Store a frozen model's Linear weights in the autocast dtype if this run does; layers stored."""
        if not self.reference_in_autocast_dtype or self.autocast_dtype is None:
            return 0
        from grpokit.kernels.linear_storage import store_linears_in

        return store_linears_in(model, self.autocast_dtype)
