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

KV layout and the decoding batch's rows: :mod:`grpokit.rollout.multiturn_rows`.

Each rollout samples from its own random stream (seeded from the engine's generator), so the tokens
do not depend on which sequences happened to share a step, i.e. on how long the tools took: the same
seed gives the same rollouts, and the same as re-prefilling every turn (``keep_cache=False``, the
baseline of ``bench/multiturn.py``). Other models (custom modules, HF models with other cache layers)
decode by full forward passes over their right-padded sequences, each step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from grpokit.machine.hardware import autocast
from grpokit.models.loading import is_hf_model
from grpokit.models.vision_inputs import image_hash
from grpokit.rollout.engine import HFRolloutEngine
from grpokit.rollout.logits_rules import logits_rules
from grpokit.rollout.multiturn_rows import CachedRows, NotCacheable, PlainRows
from grpokit.rollout.next_token import sample_next
from grpokit.rollout.types import Conversation, Rollouts, SamplingParams, Turn
from grpokit.rollout.vision_rows import SplitRows, VisionRows
from grpokit.tools.conversation import ConversationTokens
from grpokit.tools.environment import EnvironmentSession
from grpokit.tools.executor import ToolExecutor, ToolResult
from grpokit.tools.loop import ToolLoop, ToolRollout
from grpokit.tools.parsing import ToolParser


def rollout_generators(generator: torch.Generator, n: int) -> list[torch.Generator]:
    """``n`` random streams, one per rollout, seeded from ``generator`` (which advances by n draws)."""
    seeds = torch.randint(0, 2**62, (n,), generator=generator, device=generator.device).tolist()
    return [torch.Generator(device=generator.device).manual_seed(s) for s in seeds]


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
        params, loop, rollouts = self._start(prompts, num_generations, params, sessions)
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
                        cached = CachedRows(engine, rollouts, decoder, self.keep_cache)
                        record = self._run(loop, rollouts, params, generators, self._with_images(cached, rollouts))
                    except NotCacheable:
                        plain = self._with_images(PlainRows(engine, rollouts), rollouts)
                        record = self._run(loop, rollouts, params, generators, plain)
                else:
                    record = self._run(loop, rollouts, params, generators, PlainRows(engine, rollouts))
        finally:
            model.train(was_training)
        return self._rollouts(rollouts, record, num_generations, prompt_messages)

    def _start(self, prompts, num_generations: int, params: SamplingParams, sessions):
        """(params with the image placeholders suppressed where the chat has a processor, the ToolLoop, the N
        started rollouts: ``num_generations`` per prompt, each with its environment session if any)."""
        N = len(prompts) * num_generations
        if self.chat.processor is not None:  # image placeholders are never sampled (a tool image's are the tool's)
            from grpokit.models.vision_inputs import placeholder_ids

            suppress = tuple(sorted({*params.suppress_tokens, *placeholder_ids(self.engine.model)}))
            params = dataclasses.replace(params, suppress_tokens=suppress)
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
        return params, loop, rollouts

    def _with_images(self, batch, rollouts: list[ToolRollout]):
        """``batch``, or with a processor (a vision-language model) a :class:`SplitRows` that moves the rows a
        tool showed an image to a full-forward batch with their pixel inputs (:mod:`grpokit.rollout.vision_rows`)."""
        if self.chat.processor is None:
            return batch
        return SplitRows(batch, VisionRows(self.engine, rollouts), rollouts)

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
            prompt_ids.append(_with_images(prefix, rollouts[b * G].conversation.vision_prompt))
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
            **completion_images(rollouts),
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


def completion_images(rollouts: list[ToolRollout]) -> dict:
    """Rollouts' ``completion_pixels``, ``completion_images`` and ``completion_image_hashes`` of the images tools
    showed (each rollout's processor inputs concatenated over its rounds, in order); {} when no tool showed one."""
    if not any(r.conversation.pixels for r in rollouts):
        return {}
    pixels = []
    for r in rollouts:
        parts = r.conversation.pixels
        keys = sorted({k for p in parts for k in p})
        pixels.append({k: torch.cat([p[k] for p in parts if k in p]) for k in keys} if parts else None)
    return {
        "completion_pixels": pixels,
        "completion_images": [list(r.conversation.images) for r in rollouts],
        "completion_image_hashes": [[image_hash(i) for i in r.conversation.images] for r in rollouts],
    }


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
        images=None if tokens is None else [image_hash(i) for i in result.images] or None,  # shown: stored
    )


def _with_images(prefix: list[int], vision_prompt):
    """A group's prompt ids: its rendered prompts' common ``prefix``, with their pixel inputs when they have images
    (the prompts of a group are then the same: an environment observation is text after them)."""
    if vision_prompt is None:
        return prefix
    if len(prefix) != len(vision_prompt):
        raise ValueError("the rollouts of a prompt with images start from different rendered prompts")
    return vision_prompt


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    first = seqs[0]
    n = len(first)
    for seq in seqs[1:]:
        n = next((k for k, (a, b) in enumerate(zip(first[:n], seq)) if a != b), min(n, len(seq)))
    return list(first[:n])
