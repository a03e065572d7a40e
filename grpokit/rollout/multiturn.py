"""Multi-turn rollouts with tools: G conversations per prompt, decoded in one batch, each sequence's KV
cache kept across its turns.

The tool rounds follow :class:`grpokit.tools.ToolLoop` (its parsing, execution and stop rules); this
module decides what runs on the model. All running sequences decode together, one token per step.
When a sequence ends its turn (an end-of-turn or EOS token, or its token budget), the loop parses the
turn and submits its calls; the sequence leaves the decoding batch, and its KV cache is put aside
(the filled columns of its row). When its results arrive, the tokens it still lacks (its last sampled
token and the tool suffix: end of turn, tool messages, next assistant header) are prefilled on top of
its kept cache, so the conversation so far is never run again; then it rejoins the batch. The other
sequences decode on meanwhile, and the calls of different sequences run at once.

KV layout (HF models whose cache is plain ``DynamicLayer`` s: Llama, Qwen2, Qwen3, Mistral, GPT-2 ...):
a batch's cache is one :class:`grpokit.kernels.kv_cache.PreallocatedLayer` per layer in which each row
is right-aligned (every row writes its next token to the same column) with masked columns before it;
each row has its own position ids, so rows of different lengths decode together. When rows join,
the block is rebuilt from the rows in use and the joining rows' caches (a copy, no model call); rows
that leave stay in the block, decoded on and unread, until they outnumber the others (selecting rows
copies the whole cache too). Decoding steps run through the run's fused decoder when it has one, as
in :class:`grpokit.rollout.engine.HFRolloutEngine`.

Each rollout samples from its own random stream (seeded from the engine's generator), so the tokens
do not depend on which sequences happened to share a step, i.e. on how long the tools took: the same
seed gives the same rollouts, and the same as re-prefilling every turn (``keep_cache=False``, the
baseline of ``bench/multiturn.py``). Other models (custom modules, HF models with other cache layers)
decode by full forward passes over their right-padded sequences, each step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from grpokit.kernels.kv_cache import PreallocatedLayer
from grpokit.machine.hardware import autocast
from grpokit.models.kv_cache_arg import cache_kwargs, output_cache
from grpokit.models.loading import is_hf_model, logits_of
from grpokit.rollout.engine import HFRolloutEngine, left_pad
from grpokit.rollout.logits_rules import logits_rules
from grpokit.rollout.next_token import sample_next
from grpokit.rollout.types import Conversation, Rollouts, SamplingParams, Turn
from grpokit.tools.conversation import ConversationTokens
from grpokit.tools.environment import EnvironmentSession
from grpokit.tools.executor import ToolExecutor, ToolResult
from grpokit.tools.loop import ToolLoop, ToolRollout
from grpokit.tools.parsing import ToolParser

Kept = list[tuple[torch.Tensor, torch.Tensor]]  # one row's keys and values per layer, [heads, L, head_dim] each


def rollout_generators(generator: torch.Generator, n: int) -> list[torch.Generator]:
    """``n`` random streams, one per rollout, seeded from ``generator`` (which advances by n draws)."""
    seeds = torch.randint(0, 2**62, (n,), generator=generator, device=generator.device).tolist()
    return [torch.Generator(device=generator.device).manual_seed(s) for s in seeds]


class _NotCacheable(Exception):
    """The model's cache has layers other than plain DynamicLayers: decode without a kept cache."""


@dataclass
class _Block:
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


def _build(kept: list[Kept], room: int, base: _Block | None = None, base_rows: list[int] | None = None) -> _Block:
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
    return _Block(cache, mask, width, position)


class _CachedRows:
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
        self.block: _Block | None = None
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
        self.block = _build(kept, self._room(), self.block, self.slots)
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
            block = self.block = _build([], self._room(), block, self.slots)
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
            raise _NotCacheable
        block = _Block(cache, mask.bool(), ids.size(1), position[:, -1] + 1)
        kept = [block.row(u) for u in range(len(unique))]
        where = {u: n for n, u in enumerate(unique)}
        pick = [where[tuple(f)] for f in feeds]
        return out.logits[:, -1][pick], [kept[p] for p in pick]

    def _prefill_on(self, kept: list[Kept], feeds: list[list[int]]) -> tuple[torch.Tensor, list[Kept]]:
        """Prefill ``feeds`` (left-padded) on top of each row's kept cache: logits [R, V] and the grown caches."""
        device = self.engine.device
        block = _build(kept, max(len(f) for f in feeds))
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


class _PlainRows:
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


class MultiTurnEngine:
    """Multi-turn tool rollouts from ``engine``'s model (its kernels, autocast, pad and EOS ids, seed and
    policy version): ``chat`` renders and tokenizes, ``executor`` runs the calls, ``parser`` reads them
    (default: from the chat template), ``max_tool_calling_iterations`` rounds of tools at most (None:
    no limit). ``keep_cache=False`` prefills each turn's whole conversation again (for comparison).
    ``on_step``, when set, is called at each decoding step with the indices of the rollouts decoded and the
    list of all rollouts (:class:`grpokit.tools.ToolRollout`)."""

    def __init__(
        self,
        engine: HFRolloutEngine,
        chat: ConversationTokens,
        executor: ToolExecutor,
        *,
        max_tool_calling_iterations: int | None = None,
        parser: str | ToolParser | None = None,
        keep_cache: bool = True,
    ):
        self.engine, self.chat, self.executor = engine, chat, executor
        self.pad_token_id = engine.pad_token_id
        self.max_tool_calling_iterations = max_tool_calling_iterations
        self.parser = parser
        self.keep_cache = keep_cache
        self.on_step: Callable[[list[int], list[ToolRollout]], None] | None = None

    # The RolloutEngine protocol (grpokit.rollout.engine): groups seeded on their own (``seeds``); the weights, the
    # random stream and the policy version are the base engine's. Prompts are chat messages, not token ids.
    takes_group_seeds = True
    takes_raw_prompts = False

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    @property
    def generator(self) -> torch.Generator:
        return self.engine.generator

    def sync_weights(self) -> None:
        self.engine.sync_weights()

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[Mapping[str, Any]]],
        num_generations: int,
        params: SamplingParams,
        sessions: Sequence[EnvironmentSession | None] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> Rollouts:
        """``num_generations`` conversations for each chat prompt (rollouts n*G .. n*G+G-1 of prompt n);
        ``sessions``: one environment session per rollout (B*G), or None. ``params.max_completion_length``
        bounds each rollout's tokens after its prompt, the model's and the environment's together.
        ``seeds``: one per prompt; its group's random streams come from it instead of the engine's generator,
        so a group's rollouts do not depend on the other prompts of the batch
        (:mod:`grpokit.rollout.seeding`).

        Returns :class:`Rollouts` with ``loss_mask`` (1 on the tokens the model sampled; ``logprobs`` are
        theirs, 0 elsewhere) and ``conversations``. A prompt's rollouts share its ``prompt_ids``; where
        their rendered prompts differ (an environment's observation), the rest starts the completion,
        out of the loss mask."""
        N = len(prompts) * num_generations
        if sessions is not None and len(sessions) != N:
            raise ValueError(f"{len(sessions)} environment sessions for {N} rollouts; pass one per rollout")
        loop = ToolLoop(
            self.chat,
            self.executor,
            max_completion_length=params.max_completion_length,
            max_tool_calling_iterations=self.max_tool_calling_iterations,
            parser=self.parser,
        )
        rollouts = [
            loop.start(prompts[n // num_generations], None if sessions is None else sessions[n]) for n in range(N)
        ]
        prompt_messages = [len(r.messages) for r in rollouts]
        if seeds is None:
            generators = rollout_generators(self.engine.generator, N)
        else:
            if len(seeds) != len(prompts):
                raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts; pass one per prompt")
            device = self.engine.generator.device
            generators = [
                g
                for seed in seeds
                for g in rollout_generators(torch.Generator(device=device).manual_seed(seed), num_generations)
            ]
        model, engine = self.engine.model, self.engine
        was_training = model.training
        model.eval()
        try:
            dtype = engine.autocast_dtype or next(model.parameters()).dtype
            decoder = engine.kernels.decoder(model, dtype, N) if is_hf_model(model) else None
            packed = engine.kernels.sampling_linears(model, N, engine.device) if decoder is None else nullcontext()
            with autocast(engine.device, engine.autocast_dtype), packed:
                if is_hf_model(model):
                    try:
                        record = self._run(
                            loop, rollouts, params, generators, _CachedRows(engine, rollouts, decoder, self.keep_cache)
                        )
                    except _NotCacheable:
                        record = self._run(loop, rollouts, params, generators, _PlainRows(engine, rollouts))
                else:
                    record = self._run(loop, rollouts, params, generators, _PlainRows(engine, rollouts))
        finally:
            model.train(was_training)
        return self._rollouts(rollouts, record, num_generations, prompt_messages)

    def _run(self, loop: ToolLoop, rollouts, params, generators, batch) -> dict[str, dict[int, list]]:
        """Drive every rollout to its end; returns each rollout's sampled ``logprobs`` (in order) and the
        ``times`` (start, end) of its turns."""
        stops = {self.chat.end_of_turn, *self.engine.eos_token_ids.tolist()}
        turn: dict[int, list[int]] = {}
        limit: dict[int, int] = {}
        logprobs: dict[int, list[float]] = {i: [] for i in range(len(rollouts))}
        times: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(rollouts))}
        started: dict[int, float] = {}
        index = {id(r): i for i, r in enumerate(rollouts)}
        rules = None  # the logits processors (logits_rules), each rollout's context its whole conversation so far

        def join(indices: list[int]) -> None:
            nonlocal rules
            for i in indices:
                turn[i], limit[i], started[i] = [], loop.remaining(rollouts[i]), time.monotonic()
            budgets = [limit[i] - len(turn[i]) for i in [*batch.rows, *indices]]
            batch.add(indices, budgets)
            if rules is None and params.has_rules:
                empty = [[] for _ in rollouts]
                rules = logits_rules(params, empty, sorted(stops), batch.logits.size(-1), batch.logits.device)
            for i in indices if rules is not None else ():
                rules.reset(i, rollouts[i].conversation.ids)

        join(list(range(len(rollouts))))
        while True:
            if batch.rows:
                # min_new_tokens and begin_suppress_tokens count the turn's tokens (TRL: one generate call per turn)
                processed = None
                if rules is not None:
                    processed = rules.apply(batch.logits, batch.rows, [len(turn[i]) for i in batch.rows])
                generators_now = [generators[i] for i in batch.rows]
                tokens, token_logprobs = sample_next(batch.logits, params, generators_now, processed)
                if rules is not None:
                    rules.append(batch.rows, tokens)
                if self.on_step is not None:
                    self.on_step(list(batch.rows), rollouts)
                leaving, waiting = [], []
                for r, (i, token, logprob) in enumerate(zip(batch.rows, tokens.tolist(), token_logprobs.tolist())):
                    turn[i].append(token)
                    logprobs[i].append(logprob)
                    if token in stops or len(turn[i]) >= limit[i]:
                        times[i].append((started[i], time.monotonic()))
                        loop.turn_done(rollouts[i], turn[i])
                        leaving.append(r)
                        waiting.append(rollouts[i].state == "tools")
                if leaving:
                    going = set(leaving)
                    tokens = tokens[[r for r in range(len(batch.rows)) if r not in going]]
                    batch.remove(leaving, waiting)
                if batch.rows:
                    batch.step(tokens)
            elif all(r.state == "done" for r in rollouts):
                break
            arrived = loop.poll(rollouts, wait=not batch.rows)
            joining = [index[id(r)] for r in arrived if r.state == "generating"]
            if joining:
                join(joining)
        return {"logprobs": logprobs, "times": times}

    def _rollouts(self, rollouts: list[ToolRollout], record, G: int, prompt_messages: list[int]) -> Rollouts:
        """The batch's Rollouts: per group the common prefix of its rendered prompts as ``prompt_ids``."""
        prompt_ids, offsets = [], []
        for b in range(len(rollouts) // G):
            group = [r.conversation.ids[: r.conversation.prompt_length] for r in rollouts[b * G : (b + 1) * G]]
            prefix = _common_prefix(group)
            prompt_ids.append(prefix)
            offsets += [len(prefix)] * G
        completions = [r.conversation.ids[o:] for r, o in zip(rollouts, offsets)]
        T = max(max(len(c) for c in completions), 1)
        N = len(rollouts)
        ids = torch.full((N, T), self.engine.pad_token_id, dtype=torch.long)
        completion_mask = torch.zeros((N, T))
        loss_mask = torch.zeros((N, T))
        logprobs = torch.zeros((N, T))
        for n, (rollout, offset, completion) in enumerate(zip(rollouts, offsets, completions)):
            ids[n, : len(completion)] = torch.tensor(completion, dtype=torch.long)
            completion_mask[n, : len(completion)] = 1
            loss_mask[n, : len(completion)] = torch.tensor(rollout.conversation.mask[offset:], dtype=torch.float32)
            logprobs[n][loss_mask[n].bool()] = torch.tensor(record["logprobs"][n], dtype=torch.float32)
        return Rollouts(
            prompt_ids=prompt_ids,
            completion_ids=ids,
            completion_mask=completion_mask,
            logprobs=logprobs,
            finish_reasons=["length" if r.stop_reason == "length" else "stop" for r in rollouts],
            num_generations=G,
            policy_version=self.engine.policy_version,
            loss_mask=loss_mask,
            conversations=[
                self._conversation(r, o, prompt_messages[n], record["times"][n])
                for n, (r, o) in enumerate(zip(rollouts, offsets))
            ],
        )

    def _conversation(
        self, rollout: ToolRollout, offset: int, prompt_messages: int, times: list[tuple[float, float]]
    ) -> Conversation:
        """The rollout's turns: one per message after the prompt, with its token span in the completion, then
        one per tool result that was not shown."""
        conversation = rollout.conversation
        spans = [(a - offset, b - offset) for a, b in conversation.spans]
        ends = [a for a, _ in spans[1:]] + [len(conversation.ids) - offset]
        messages = rollout.messages[prompt_messages:]
        turns, assistant, tool = [], 0, 0
        for message in messages:
            if message["role"] == "assistant":
                a, b = spans[assistant]
                ids = conversation.ids[a + offset : b + offset]
                if ids and ids[-1] == self.chat.end_of_turn:
                    ids = ids[:-1]
                turns.append(
                    Turn(
                        "assistant",
                        self.chat.tokenizer.decode(ids, skip_special_tokens=False),
                        (a, b),
                        tool_calls=[c["function"] for c in message.get("tool_calls", [])],
                        started=times[assistant][0],
                        ended=times[assistant][1],
                    )
                )
                assistant += 1
            else:
                turns.append(_tool_turn(rollout.results[tool], (spans[assistant - 1][1], ends[assistant - 1])))
                tool += 1
        # calls that ran but whose results did not fit in the token budget: never shown, still recorded
        turns += [_tool_turn(result, None) for result in rollout.results[tool:]]
        return Conversation(messages, turns, rollout.stop_reason, rollout.iterations)


def _tool_turn(result: ToolResult, tokens: tuple[int, int] | None) -> Turn:
    return Turn(
        "tool",
        result.content,
        tokens,
        name=result.call.name,
        arguments=result.call.arguments,
        status=result.status,
        error=result.error,
        started=result.started,
        ended=result.ended,
    )


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    first = seqs[0]
    n = len(first)
    for seq in seqs[1:]:
        n = next((k for k, (a, b) in enumerate(zip(first[:n], seq)) if a != b), min(n, len(seq)))
    return list(first[:n])
