"""Repeating and selecting the batch rows of a model's KV cache, the linear-attention layers of hybrid models
included: Qwen3.5's gated delta-net layers keep conv and recurrent states, and transformers gives those layers no
``batch_repeat_interleave`` / ``batch_select_indices``. And :func:`fresh_state_writes`: those layers write their next
states with an in-place ``copy_``, which breaks a backward that runs through the cache (the shared-prompt pass in
training)."""

from __future__ import annotations

import torch

STATES = ("conv_states", "recurrent_states")  # transformers' LinearAttentionCacheLayerMixin: {state index: [B, ...]}


def repeat_rows(cache, repeats: int) -> None:
    """Each row of ``cache`` repeated ``repeats`` times in place ([B, ...] -> [B * repeats, ...], interleaved)."""
    _apply(cache, lambda t: t.repeat_interleave(repeats, dim=0), lambda c: c.batch_repeat_interleave(repeats))


def select_rows(cache, index: torch.Tensor) -> None:
    """Keep the rows ``index`` of ``cache`` in place ([B, ...] -> [len(index), ...])."""
    _apply(cache, lambda t: t[index], lambda c: c.batch_select_indices(index))


def fresh_state_writes(cache) -> None:
    """Make each linear-attention layer of ``cache`` write its next conv / recurrent state into a fresh copy.

    transformers updates those states with ``state.copy_(new)`` (a static address for CUDA graphs), but the state
    read by the same forward is saved for the backward (the gated delta rule's ``initial_state @ ...``), so a pass
    that trains through the cache fails with "modified by an inplace operation". The copy made before each write
    leaves the saved tensor as it was; values are the same as without it."""
    for layer in getattr(cache, "layers", None) or []:
        if _is_linear(layer):
            for name, update in (("conv_states", "update_conv_state"), ("recurrent_states", "update_recurrent_state")):
                setattr(layer, update, _copy_before(getattr(layer, name), getattr(layer, update)))


def _copy_before(states: dict, update):
    def write(new, state_idx: int = 0, **kwargs):
        if torch.is_tensor(states.get(state_idx)):
            states[state_idx] = states[state_idx].clone()
        return update(new, state_idx, **kwargs)

    return write


def _apply(cache, rows, method) -> None:
    layers = getattr(cache, "layers", None)
    if layers is None or not any(_is_linear(layer) for layer in layers):
        method(cache)  # the cache's own method (plain attention layers, grpokit's preallocated cache)
        return
    for layer in layers:
        if not _is_linear(layer):  # an attention layer: its own method (grpokit's PreallocatedLayer moves its buffers)
            method(layer)
            continue
        for name in STATES:
            states = getattr(layer, name)
            for i, state in states.items():
                if torch.is_tensor(state):
                    states[i] = rows(state)
        if getattr(layer, "keys", None) is not None:  # a hybrid layer's attention part
            method(_AttentionPart(layer))


def _is_linear(layer) -> bool:
    return all(isinstance(getattr(layer, name, None), dict) for name in STATES)


class _AttentionPart:
    """A layer's keys and values, rows repeated or selected as transformers' DynamicLayer does."""

    def __init__(self, layer):
        self.layer = layer

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._set(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, index: torch.Tensor) -> None:
        self._set(lambda t: t[index])

    def _set(self, rows) -> None:
        if self.layer.keys is not None and self.layer.keys.numel() > 0:
            self.layer.keys, self.layer.values = rows(self.layer.keys), rows(self.layer.values)
