"""Log-probs (and entropies) of chosen tokens straight from hidden states: LM head + log-softmax fused.

For m positions with hidden states h [m, H], LM head W [V, H] (bias b) and temperature T:

    z = (h W^T + b) / T,   log p(y) = z_y - lse,   lse = logsumexp(z),   H(p) = -sum_j p_j log p_j,
    d log p(y) / dz_j = 1[j = y] - p_j,   p_j = exp(z_j - lse).

The float32 [m, V] log-softmax never exists whole (the chunked LM head of Liger and TRL): the
forward runs over chunks of rows and keeps lse [m]; the backward goes over chunks of the
vocabulary, so each slice of the weight gradient is computed once, and the hidden-state gradient
[m, H] is the small sum. A chunk holds about 2**22 logits, so its elementwise work stays in cache.
The backward needs the logits again: those up to ``SAVED_LOGITS_BYTES`` (in the compute dtype) are
kept from the forward, bigger ones are recomputed there (a third more LM-head matmul FLOPs instead
of the memory).

The weight gradient of a trainable leaf weight is added straight into ``weight.grad`` (the
gradient-accumulation fusion of Megatron-LM) instead of being returned: a returned [V, H] gradient
would be a fresh tensor per micro-batch, summed out of place with a tied embedding's gradient and
then added to ``.grad`` again. Hence this function is for ``loss.backward()``:
``torch.autograd.grad`` with respect to the weight would not see that part.

Under autocast the matmuls run in the autocast dtype, as ``F.linear`` would, with the weight cast
once per call and kept for backward, or once per :meth:`WeightCasts.reuse` block (the micro-batches
of one optimizer step share it). Softmax, log-probs, entropies and the gradient of the logits are
float32; the weight gradient is returned in the weight's dtype.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

# Logits per chunk: 2**22 (16 MiB in float32).
CHUNK_ELEMENTS = 2**22

# Largest [m, V] logits (in the compute dtype) kept from the forward for the backward; bigger ones are
# recomputed there. 64 MiB: 512 positions x a 32,000-token vocabulary in bf16 or float32 (docs/performance.md).
SAVED_LOGITS_BYTES = 2**26


class WeightCasts:
    """Casts of LM-head weights to the autocast dtype, reused inside :meth:`reuse` blocks.

    One per run (held by :class:`grpokit.kernels.Kernels`), so runs in one process share nothing.
    """

    def __init__(self):
        self._casts: dict | None = None  # (id, version, dtype) of a weight -> its cast, while a block is open

    @contextlib.contextmanager
    def reuse(self):
        """Cast each head weight to the autocast dtype once inside this block (nested blocks share the
        outermost one's casts), not once per call.

        A cast is reused only while the weight is unchanged (same tensor version), so an optimizer
        step inside the block simply leads to a new cast.
        """
        outer = self._casts
        if outer is None:
            self._casts = {}
        try:
            yield
        finally:
            self._casts = outer

    def cast(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if weight.dtype == dtype:
            return weight
        if self._casts is None:
            return weight.to(dtype)
        key = (id(weight), weight._version, dtype)
        if key not in self._casts:
            self._casts.clear()  # one weight at a time: a stale cast of an updated weight is never kept
            self._casts[key] = weight.detach().to(dtype)
        return self._casts[key]


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


class _FusedHeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, bias, tokens, temperature, chunk_elements, with_entropy, saved_logits_bytes, casts
    ):
        dtype = _compute_dtype(weight)
        w = casts.cast(weight, dtype) if casts is not None else weight.to(dtype)  # [V, H]
        b = None if bias is None else bias.to(dtype)
        h = hidden.to(dtype)  # [m, H]
        m, V = h.size(0), w.size(0)
        rows = max(1, chunk_elements // V)
        logprobs = torch.empty(m, dtype=torch.float32, device=h.device)  # [m]
        logsumexp = torch.empty_like(logprobs)  # [m]
        entropy = torch.empty_like(logprobs) if with_entropy else None
        # small enough: all logits in one matmul, kept for the backward (which then skips its matmul)
        keep = any(ctx.needs_input_grad[:3]) and m * V * w.element_size() <= saved_logits_bytes
        with torch.autocast(h.device.type, enabled=False):
            logits = F.linear(h, w, b) if keep else None  # [m, V]
            for s in range(0, m, rows):
                # a fresh float32 chunk [c, V] (the kept logits must not change in place)
                z = (
                    logits[s : s + rows].to(torch.float32, copy=True)
                    if keep
                    else F.linear(h[s : s + rows], w, b).float()
                )
                if temperature != 1.0:
                    z.div_(temperature)
                logp = torch.log_softmax(z, dim=-1)  # [c, V] (one fused kernel: ~2x faster than logsumexp)
                index = tokens[s : s + rows, None]  # [c, 1]
                logprobs[s : s + rows] = logp.gather(-1, index).squeeze(-1)
                logsumexp[s : s + rows] = z.gather(-1, index).squeeze(-1) - logprobs[s : s + rows]  # z_y - log p(y)
                del z  # at most two [c, V] float32 temporaries at a time
                if with_entropy:
                    entropy[s : s + rows] = -logp.exp().mul_(logp).sum(-1)  # H = -sum p log p: [c, V] -> [c]
        ctx.save_for_backward(h, w, b, tokens, logsumexp, logits)
        # a trainable leaf weight gets its gradient added straight into .grad (see backward)
        ctx.accumulate_into = weight if weight.is_leaf and weight.requires_grad else None
        ctx.temperature, ctx.chunk_elements = temperature, chunk_elements
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        if entropy is not None:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        h, w, b, tokens, logsumexp, logits = ctx.saved_tensors
        T, (hidden_dtype, weight_dtype, bias_dtype) = ctx.temperature, ctx.dtypes
        m, V = h.size(0), w.size(0)
        cols = max(1, ctx.chunk_elements // max(m, 1))
        upstream = grad_logprobs.float()[:, None]  # [m, 1]
        grad_hidden = torch.zeros(h.shape, dtype=torch.float32, device=h.device)  # [m, H]
        grad_weight = None
        if ctx.accumulate_into is not None:
            if ctx.accumulate_into.grad is None:
                ctx.accumulate_into.grad = torch.zeros((V, h.size(1)), dtype=weight_dtype, device=h.device)
            grad_weight = ctx.accumulate_into.grad
        elif ctx.needs_input_grad[1]:
            grad_weight = torch.zeros((V, h.size(1)), dtype=weight_dtype, device=h.device)
        grad_bias = (
            torch.empty(V, dtype=bias_dtype, device=h.device) if b is not None and ctx.needs_input_grad[2] else None
        )
        rows = torch.arange(m, device=h.device)
        with torch.autocast(h.device.type, enabled=False):
            for v in range(0, V, cols):
                if logits is not None:
                    z = logits[:, v : v + cols].to(torch.float32, copy=True)  # [m, c]
                else:
                    z = F.linear(h, w[v : v + cols], None if b is None else b[v : v + cols]).float()  # [m, c]
                if T != 1.0:
                    z.div_(T)
                grad_z = z.sub_(logsumexp[:, None]).exp_().mul_(-upstream)  # -p_j * upstream, [m, c]
                here = (tokens >= v) & (tokens < v + cols)  # [m] rows whose token is in this slice
                grad_z.index_put_((rows[here], tokens[here] - v), upstream[here, 0], accumulate=True)
                if T != 1.0:
                    grad_z.div_(T)
                grad_z = grad_z.to(h.dtype)
                grad_hidden += grad_z @ w[v : v + cols]  # [m, c] x [c, H]
                if grad_weight is not None:
                    grad_weight[v : v + cols] += grad_z.t() @ h  # [c, m] x [m, H]
                if grad_bias is not None:
                    grad_bias[v : v + cols] = grad_z.float().sum(0)
        if ctx.accumulate_into is not None:
            grad_weight = None  # already in .grad
        return grad_hidden.to(hidden_dtype), grad_weight, grad_bias, None, None, None, None, None, None


def fused_head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
    saved_logits_bytes: int = SAVED_LOGITS_BYTES,
    casts: WeightCasts | None = None,
):
    """(log p(tokens) [m], entropy [m] or None), float32, for hidden [m, H] under the head (weight [V, H], bias [V]).

    Differentiable in ``hidden``, ``weight`` and ``bias`` (the entropy is a metric: not differentiated);
    a trainable leaf ``weight`` receives its gradient in ``weight.grad`` directly (module docstring).
    ``chunk_elements``: logits per chunk; ``saved_logits_bytes``: the largest logits kept for the
    backward instead of recomputed there. Results do not depend on either (up to matmul rounding).
    ``casts``: the run's :class:`WeightCasts` (None: the weight is cast at each call).
    """
    if hidden.dim() != 2 or tokens.shape != hidden.shape[:1]:
        raise ValueError(f"hidden must be [m, H] and tokens [m]; got {tuple(hidden.shape)} and {tuple(tokens.shape)}")
    return _FusedHeadLogprobs.apply(
        hidden, weight, bias, tokens.long(), float(temperature), chunk_elements, with_entropy, saved_logits_bytes, casts
    )
