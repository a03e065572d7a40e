"""Log-probs (and entropies) of chosen tokens straight from hidden states: LM head + log-softmax fused.

For m positions with hidden states h [m, H], LM head W [V, H] (bias b) and temperature T:

    z = (h W^T + b) / T,   log p(y) = z_y - lse,   lse = logsumexp(z),   H(p) = -sum_j p_j log p_j,
    d log p(y) / dz_j = 1[j = y] - p_j,   p_j = exp(z_j - lse).

The float32 [m, V] log-softmax never exists whole (the chunked LM head of Liger and TRL): the
forward goes over slices of the vocabulary with an online logsumexp and keeps lse [m]; the backward
goes over the same slices, so each slice of the weight gradient is computed once, and the
hidden-state gradient [m, H] is the small sum. A slice holds about 2**22 logits (all m rows), so each
matmul reads its part of the weight once for every row. The backward needs the logits again: those
up to ``SAVED_LOGITS_BYTES`` (in the compute dtype) are computed in one matmul and kept from the
forward (which then reduces them in chunks of rows), bigger ones are recomputed there (a third more
LM-head matmul FLOPs instead of the memory).

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


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The autocast dtype, else the wider of the two (a weight stored in bf16 for float32 hidden states computes in
    float32)."""
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _over_rows(logits, tokens, temperature: float, chunk_elements: int, with_entropy: bool):
    """(log p(tokens), logsumexp, entropy or None), each [m], from logits [m, V] in chunks of rows."""
    m, V = logits.shape
    rows = max(1, chunk_elements // V)
    logprobs = torch.empty(m, dtype=torch.float32, device=logits.device)  # [m]
    logsumexp = torch.empty_like(logprobs)  # [m]
    entropy = torch.empty_like(logprobs) if with_entropy else None
    for s in range(0, m, rows):
        z = logits[s : s + rows].to(torch.float32, copy=True)  # a fresh float32 chunk [c, V] (logits are kept)
        if temperature != 1.0:
            z.div_(temperature)
        logp = torch.log_softmax(z, dim=-1)  # [c, V] (one fused kernel: ~2x faster than logsumexp)
        index = tokens[s : s + rows, None]  # [c, 1]
        logprobs[s : s + rows] = logp.gather(-1, index).squeeze(-1)
        logsumexp[s : s + rows] = z.gather(-1, index).squeeze(-1) - logprobs[s : s + rows]  # z_y - log p(y)
        del z  # at most two [c, V] float32 temporaries at a time
        if with_entropy:
            entropy[s : s + rows] = -logp.exp().mul_(logp).sum(-1)  # H = -sum p log p: [c, V] -> [c]
    return logprobs, logsumexp, entropy


def _over_vocabulary(h, w, b, tokens, temperature: float, chunk_elements: int, with_entropy: bool):
    """(log p(tokens), logsumexp, entropy or None), each [m], computing the logits of hidden states h [m, H] in
    slices of the vocabulary, with an online logsumexp (Milakov & Gimelshein 2018).

    All m rows go through each slice of the weight, so each matmul reads its slice once for m rows (slices
    of rows instead would read the whole [V, H] weight once per slice: a 152k vocabulary's bf16 weight is
    272 MB). Per row, over the slices: the running max M, S = sum exp(z - M) and, for the entropy,
    E = sum exp(z - M) (z - M); when M grows to M', S <- S e^(M - M') and E <- e^(M - M') (E + (M - M') S).
    Then lse = M + log S and H = lse - sum p z = log S - E / S.
    """
    m, V = h.size(0), w.size(0)
    cols = max(1, chunk_elements // max(m, 1))
    # finite, so that the first slice's rescaling e^(M - M') S is 0 * 0, not inf * 0
    running_max = torch.full((m,), torch.finfo(torch.float32).min, dtype=torch.float32, device=h.device)  # [m]
    total = torch.zeros(m, dtype=torch.float32, device=h.device)  # S [m]
    moment = torch.zeros_like(total) if with_entropy else None  # E [m]
    chosen = torch.empty_like(total)  # z_y [m]
    rows = torch.arange(m, device=h.device)
    for v in range(0, V, cols):
        z = F.linear(h, w[v : v + cols], None if b is None else b[v : v + cols]).float()  # [m, c]
        if temperature != 1.0:
            z.div_(temperature)
        here = (tokens >= v) & (tokens < v + cols)  # [m] rows whose token is in this slice
        chosen[here] = z[rows[here], tokens[here] - v]
        new_max = torch.maximum(running_max, z.amax(-1))  # [m]
        shift = running_max - new_max  # [m], <= 0
        scale = shift.exp()  # [m]
        z.sub_(new_max[:, None])  # z - M' [m, c]
        e = z.exp()  # [m, c]
        if moment is not None:
            # sum_j e_j z_j per row as a batched dot product: no [m, c] product tensor (~1.5x faster than mul + sum)
            moment.add_(shift * total).mul_(scale).add_(torch.bmm(e[:, None], z[:, :, None]).view(m))
        total.mul_(scale).add_(e.sum(-1))
        running_max = new_max
        del z, e
    logsumexp = running_max + total.log()  # [m]
    entropy = total.log() - moment / total if moment is not None else None
    return chosen - logsumexp, logsumexp, entropy


class _FusedHeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, bias, tokens, temperature, chunk_elements, with_entropy, saved_logits_bytes, casts
    ):
        dtype = _compute_dtype(hidden, weight)
        w = casts.cast(weight, dtype) if casts is not None else weight.to(dtype)  # [V, H]
        b = None if bias is None else bias.to(dtype)
        h = hidden.to(dtype)  # [m, H]
        m, V = h.size(0), w.size(0)
        # small enough: all logits in one matmul, kept for the backward (which then skips its matmul)
        keep = any(ctx.needs_input_grad[:3]) and m * V * w.element_size() <= saved_logits_bytes
        with torch.autocast(h.device.type, enabled=False):
            if keep:
                logits = F.linear(h, w, b)  # [m, V]
                logprobs, logsumexp, entropy = _over_rows(logits, tokens, temperature, chunk_elements, with_entropy)
            else:
                logits = None
                logprobs, logsumexp, entropy = _over_vocabulary(
                    h, w, b, tokens, temperature, chunk_elements, with_entropy
                )
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
