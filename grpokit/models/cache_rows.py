"""Repeating and selecting the batch rows of a model's KV cache, the linear-attention layers of hybrid models
included: Qwen3.5's gated delta-net layers keep conv and recurrent states, and transformers gives those layers no
``batch_repeat_interleave`` / ``batch_select_indices``."""

from __future__ import annotations

import torch

STATES = ("conv_states", "recurrent_states")  # transformers' LinearAttentionCacheLayerMixin: {state index: [B, ...]}


def repeat_rows(cache, repeats: int) -> None:
    """Each row of ``cache`` repeated ``repeats`` times in place ([B, ...] -> [B * repeats, ...], interleaved)."""
    _apply(cache, lambda t: t.repeat_interleave(repeats, dim=0), lambda c: c.batch_repeat_interleave(repeats))


def select_rows(cache, index: torch.Tensor) -> None:
    """Keep the rows ``index`` of ``cache`` in place ([B, ...] -> [len(index), ...])."""
    _apply(cache, lambda t: t[index], lambda c: c.batch_select_indices(index))


def _apply(cache, rows, method) -> None:
    layers = getattr(cache, "layers", None)
    if layers is None or not any(_is_linear(layer) for layer in layers):
        method(cache)  # the cache's own method (plain attention layers, grpokit's preallocated cache)
        return
    for layer in layers:
        if _is_linear(layer):
            for name in STATES:
                states = getattr(layer, name)
                for i, state in states.items():
                    if torch.is_tensor(state):
                        states[i] = rows(state)
        if getattr(layer, "keys", None) is not None:  # an attention layer, or a hybrid layer's attention part
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
