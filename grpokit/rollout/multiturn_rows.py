"""The decoding batch of multi-turn rollouts (:class:`grpokit.rollout.multiturn.MultiTurnEngine`): rows join when
their turn's tokens are prefilled, decode one token per step together, and leave when their turn ends, their KV
cache kept for the next turn.

KV layout (HF models whose cache is plain ``DynamicLayer`` s: Llama, Qwen2, Qwen3, Mistral, GPT-2 ...):
a batch's cache is one :class:`grpokit.kernels.kv_cache.PreallocatedLayer` per layer in which each row
is right-aligned (every row writes its next token to the same column) with masked columns before it;
each row has its own position ids, so rows of different lengths decode together. When rows join,
the block is rebuilt from the rows in use and the joining rows' caches (a copy, no model call); rows
that leave stay in the block, decoded on and unread, until they outnumber the others (selecting rows
copies the whole cache too). Decoding steps run through the run's fused decoder when it has one, as
in :class:`grpokit.rollout.engine.HFRolloutEngine`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from grpokit.kernels.kv_cache import PreallocatedLayer
from grpokit.models.kv_cache_arg import cache_kwargs, output_cache
from grpokit.models.loading import logits_of
from grpokit.rollout.engine import HFRolloutEngine, left_pad
from grpokit.tools.loop import ToolRollout

Kept = list[tuple[torch.Tensor, torch.Tensor]]  # one row's keys and values per layer, [heads, L, head_dim] each


class NotCacheable(Exception):
    """The model's cache has layers other than plain DynamicLayers: decode without a kept cache."""


@dataclass
class Block:
    """Rows of KV cache decoded together: ``cache`` (a PreallocatedLayer per layer), ``mask`` [R, capacity]
    (True = a filled column), ``length`` (columns written, the same for every row: rows are right-aligned)
    and ``position`` [R] (each row's next position: its real tokens so far)."""

    cache: DynamicCache
    mask: torch.Tensor
    length: int
    position: torch.Tensor

    def row(self, r: int) -> Kept:
        """Row ``r``'s filled columns, per layer (copied)."""
        cols = self.mask[r, : self.length].nonzero().squeeze(-1)
        return [(layer.keys[r][:, cols], layer.values[r][:, cols]) for layer in self.cache.layers]


def build_block(kept: list[Kept], room: int, base: Block | None = None, base_rows: list[int] | None = None) -> Block:
    """A block of ``base``'s rows ``base_rows`` (their filled columns copied once) then the ``kept`` rows,
    right-aligned at the longest, with ``room`` free columns; the columns left of a row's start are zeros,
    masked."""
    base_rows = [] if base is None else base_rows
    old_width = 0 if base is None else base.length
    width = max([old_width, *(k[0][0].shape[-2] for k in kept)])
    rows, capacity, shift = len(base_rows) + len(kept), width + room, width - old_width
    layers = [] if base is None else [(layer.keys, layer.values) for layer in base.cache.layers]
    ref = kept[0][0][0] if kept else layers[0][0]
    in_order = base_rows == list(range(len(base_rows))) and base is not None and len(base_rows) == base.mask.size(0)
    built = []
    for i in range(len(kept[0]) if kept else len(layers)):
        buffers = []
        for part in (0, 1):  # keys, values
            like = kept[0][i][part] if kept else layers[i][part][0]
            buffer = like.new_empty((rows, like.shape[0], capacity, like.shape[-1]))
            if base_rows:
                buffer[: len(base_rows), :, :shift] = 0
                if in_order:  # one copy of the whole block
                    buffer[: len(base_rows), :, shift:width] = layers[i][part]
                else:  # row by row: no gathered temporary
                    for r, slot in enumerate(base_rows):
                        buffer[r, :, shift:width] = layers[i][part][slot]
            for r, k in enumerate(kept, start=len(base_rows)):
                start = width - k[i][part].shape[-2]
                buffer[r, :, :start] = 0
                buffer[r, :, start:width] = k[i][part]
            buffers.append(buffer)
        built.append(PreallocatedLayer.wrap(*buffers, width))
    mask = torch.zeros((rows, capacity), dtype=torch.bool, device=ref.device)
    lengths = torch.tensor([k[0][0].shape[-2] for k in kept], dtype=torch.long, device=ref.device)
    position = lengths
    if base_rows:
        index = torch.tensor(base_rows, dtype=torch.long, device=ref.device)
        mask[: len(base_rows), shift:width] = base.mask[index, :old_width]
        position = torch.cat([base.position[index], lengths])
    for r, k in enumerate(kept, start=len(base_rows)):
        mask[r, width - k[0][0].shape[-2] : width] = True
    cache = DynamicCache()
    cache.layers = built
    return Block(cache, mask, width, position)


class CachedRows:
    """The decoding batch of an HF model with a KV cache, and the caches of the rows put aside.

    ``rows``: rollout index of each batch row; ``logits`` [A, V]: their next-token logits. ``keep``:
    keep a leaving row's cache for its next turn (else its whole conversation is prefilled again).
    """

    def __init__(self, engine: HFRolloutEngine, rollouts: list[ToolRollout], decoder, keep: bool):
        self.engine, self.model, self.rollouts, self.decoder, self.keep = engine, engine.model, rollouts, decoder, keep
        self.four_d = decoder is not None or engine._prepared_step_mask()
        self.kept: dict[int, Kept] = {}
        self.rows: list[int] = []
        self.slots: list[int] = []  # the block row of each of ``rows``; the block's other rows are left over
        self.logits: torch.Tensor | None = None
        self.block: Block | None = None
        self.budget = 0  # the most tokens a row of the batch may still add

    def add(self, joining: list[int], budgets: list[int]) -> None:
        """Prefill what ``joining`` rollouts lack in their caches and merge them into the batch; ``budgets``:
        tokens each row of the merged batch may still add (the cache grows up to that)."""
        if all(i in self.kept for i in joining):
            feeds = [self.rollouts[i].conversation.ids[self.kept[i][0][0].shape[-2] :] for i in joining]
            logits, kept = self._prefill_on([self.kept.pop(i) for i in joining], feeds)
        else:
            logits, kept = self._prefill([self.rollouts[i].conversation.ids for i in joining])
        self.budget = max(budgets)
        self.block = build_block(kept, self._room(), self.block, self.slots)
        self.logits = logits if self.logits is None else torch.cat([self.logits, logits])
        self.rows = [*self.rows, *joining]
        self.slots = list(range(len(self.rows)))

    def remove(self, leaving: list[int], waiting: list[bool]) -> None:
        """Batch rows ``leaving`` (positions in ``rows``) leave; those ``waiting`` on tools keep their cache.

        Their block rows stay (decoded on, unread) until the batch is rebuilt, or until they outnumber
        the rows in use: selecting rows copies the whole cache, which rows leaving one by one would repeat.
        """
        for r, wait in zip(leaving, waiting):
            if wait and self.keep:
                self.kept[self.rows[r]] = self.block.row(self.slots[r])
        gone = set(leaving)
        stay = [r for r in range(len(self.rows)) if r not in gone]
        self.rows, self.slots = [self.rows[r] for r in stay], [self.slots[r] for r in stay]
        if not stay:
            self.block = self.logits = None
            return
        self.logits = self.logits[torch.tensor(stay, device=self.logits.device)]
        block = self.block
        if 2 * len(self.slots) < block.mask.size(0):
            index = torch.tensor(self.slots, device=block.mask.device)
            block.cache.batch_select_indices(index)
            block.mask, block.position = block.mask[index], block.position[index]
            self.slots = list(range(len(self.slots)))

    def step(self, tokens: torch.Tensor) -> None:
        """Feed each row's sampled token [A]; ``logits`` becomes the next step's."""
        block = self.block
        if block.length == block.mask.size(1):  # full: grow (rows decode on until their budget)
            block = self.block = build_block([], self._room(), block, self.slots)
            self.slots = list(range(len(self.slots)))
        slots = torch.tensor(self.slots, device=tokens.device)
        if len(self.slots) < block.mask.size(0):
            tokens = torch.full((block.mask.size(0),), self.engine.pad_token_id, device=tokens.device).index_copy(
                0, slots, tokens
            )  # [S]: left-over rows decode a pad token
        block.mask[:, block.length] = True
        mask = block.mask[:, : block.length + 1]
        position = block.position[:, None]  # [S, 1]
        if self.decoder is not None:
            logits = self.decoder.step(tokens, position, mask[:, None, None, :], block.cache)
        else:
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask[:, None, None, :] if self.four_d else mask.long(),
                position_ids=position,
                **cache_kwargs(self.model, block.cache),
                use_cache=True,
            )
            logits = out.logits[:, -1]  # [S, V]
        self.logits = logits if len(self.slots) == logits.size(0) else logits[slots]  # [A, V]
        block.length += 1
        block.position = block.position + 1
        self.budget -= 1

    def _room(self) -> int:
        """Free columns to give a rebuilt batch: the rows' budget, at most a quarter of the width (at least
        32): rows join and leave often, and each rebuild or row selection copies the whole buffer."""
        width = 0 if self.block is None else self.block.length
        return max(1, min(self.budget + 1, max(32, width // 4)))

    def _prefill(self, feeds: list[list[int]]) -> tuple[torch.Tensor, list[Kept]]:
        """Prefill whole sequences (identical ones once): their next-token logits [R, V] and caches."""
        unique = list(dict.fromkeys(tuple(f) for f in feeds))
        ids, mask = left_pad([list(u) for u in unique], self.engine.pad_token_id, self.engine.device)  # [U, L]
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True, logits_to_keep=1)
        cache = output_cache(out)
        if not all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None])):
            raise NotCacheable
        block = Block(cache, mask.bool(), ids.size(1), position[:, -1] + 1)
        kept = [block.row(u) for u in range(len(unique))]
        where = {u: n for n, u in enumerate(unique)}
        pick = [where[tuple(f)] for f in feeds]
        return out.logits[:, -1][pick], [kept[p] for p in pick]

    def _prefill_on(self, kept: list[Kept], feeds: list[list[int]]) -> tuple[torch.Tensor, list[Kept]]:
        """Prefill ``feeds`` (left-padded) on top of each row's kept cache: logits [R, V] and the grown caches."""
        device = self.engine.device
        block = build_block(kept, max(len(f) for f in feeds))
        feed_ids, feed_mask = left_pad(feeds, self.engine.pad_token_id, device)  # [R, S]
        S = feed_ids.size(1)
        block.mask[:, block.length : block.length + S] = feed_mask.bool()
        pads = S - torch.tensor([len(f) for f in feeds], device=device)  # [R]
        position = (block.position[:, None] + torch.arange(S, device=device) - pads[:, None]).clamp(min=0)  # [R, S]
        out = self.model(
            input_ids=feed_ids,
            attention_mask=block.mask[:, : block.length + S].long(),
            position_ids=position,
            **cache_kwargs(self.model, block.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        block.length += S
        return out.logits[:, -1], [block.row(r) for r in range(len(feeds))]


class PlainRows:
    """The decoding batch of a model without a usable KV cache: each step is a full forward pass over
    the rows' right-padded sequences (harmless under a causal model), logits taken at each row's end."""

    def __init__(self, engine: HFRolloutEngine, rollouts: list[ToolRollout]):
        self.engine, self.rollouts = engine, rollouts
        self.rows: list[int] = []
        self.seqs: list[list[int]] = []
        self.logits: torch.Tensor | None = None

    def add(self, joining: list[int], budgets: list[int]) -> None:
        self.rows = [*self.rows, *joining]
        self.seqs = [*self.seqs, *(list(self.rollouts[i].conversation.ids) for i in joining)]
        self._forward()

    def remove(self, leaving: list[int], waiting: list[bool]) -> None:
        gone = set(leaving)
        stay = [r for r in range(len(self.rows)) if r not in gone]
        self.rows, self.seqs = [self.rows[r] for r in stay], [self.seqs[r] for r in stay]
        self.logits = self.logits[torch.tensor(stay, device=self.logits.device)] if stay else None

    def step(self, tokens: torch.Tensor) -> None:
        for seq, token in zip(self.seqs, tokens.tolist()):
            seq.append(token)
        self._forward()

    def _forward(self) -> None:
        width = max(len(s) for s in self.seqs)
        ids = torch.full((len(self.seqs), width), self.engine.pad_token_id, dtype=torch.long)
        for r, seq in enumerate(self.seqs):
            ids[r, : len(seq)] = torch.tensor(seq)
        logits = logits_of(self.engine.model(ids.to(self.engine.device)))  # [A, L, V]
        last = torch.tensor([len(s) - 1 for s in self.seqs], device=logits.device)
        self.logits = logits[torch.arange(len(self.seqs), device=logits.device), last]  # [A, V]
