"""A KV cache allocated once for a whole generation.

Hugging Face's ``DynamicLayer`` appends each decoded token with ``torch.cat``, which copies the
layer's whole cache at every step (O(T^2) bytes over a completion). :class:`PreallocatedLayer`
keeps keys and values in buffers sized for the prompt plus ``max_completion_length`` and writes
each new token in place; attention reads a view of the filled part, so it costs what
``DynamicLayer``'s attention costs, without the copies. HF's ``StaticCache`` is not used: it
attends over its full capacity at every step and cannot drop finished rows.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers of ``capacity`` positions.

    ``keys`` / ``values`` are views [rows, heads, length, head_dim] of the filled part, as
    ``DynamicLayer`` exposes them, so masks and attention see the same shapes.
    """

    is_croppable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.length = keys.shape[-2]
        self._keys = keys.new_empty((*keys.shape[:2], capacity, keys.shape[-1]))  # [rows, heads, capacity, head_dim]
        self._values = values.new_empty((*values.shape[:2], capacity, values.shape[-1]))
        self._keys[:, :, : self.length] = keys
        self._values[:, :, : self.length] = values
        self._expose()

    @classmethod
    def wrap(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> PreallocatedLayer:
        """A layer over buffers the caller filled, [rows, heads, capacity, head_dim], whose first ``length``
        positions hold keys and values (no copy)."""
        layer = cls.__new__(cls)
        DynamicLayer.__init__(layer)
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        layer.length, layer._keys, layer._values = length, keys, values
        layer._expose()
        return layer

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            raise ValueError(f"KV cache full: {end} positions needed, {self._keys.shape[-2]} allocated")
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._keys, self._values = self._keys[indices], self._values[indices]
        self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._keys = self._keys.repeat_interleave(repeats, dim=0)
        self._values = self._values.repeat_interleave(repeats, dim=0)
        self._expose()


def preallocate(cache, capacity: int) -> None:
    """Replace each plain, filled ``DynamicLayer`` of ``cache`` by a :class:`PreallocatedLayer` of
    ``capacity`` positions, in place. Other layer kinds (sliding window, linear attention) are kept."""
    layers = getattr(cache, "layers", None) or []
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel() > 0:
            layers[i] = PreallocatedLayer(layer.keys, layer.values, capacity)
