"""Multi-turn tool rollouts sampled with transformers' ``model.generate``: TRL's round loop without vLLM.

TRL's ``_tool_call_loop`` generates a round at a time: every rollout's first turn in one ``generate`` call (each
prompt repeated G times), then the calls of the turns that made some are run, then the rollouts that called tools
generate their next turn together in ONE ``generate`` call over their whole conversation so far (prompt, completion
so far and the tool suffix tokens, left-padded), and so on until no rollout calls a tool or
``max_tool_calling_iterations`` rounds ran. This engine runs that loop (``generation.engine: transformers`` with
tools, or a GRPOTrainer whose model's ``generate`` was replaced: docs/from_trl.md), so a patched or custom
``generate`` sees TRL's calls: the same row counts, ``input_ids``, ``attention_mask`` and ``generation_config``.

Parsing, tool execution, budgets and stop rules are :class:`grpokit.tools.ToolLoop`'s, as in grpokit's own
multi-turn engine (:mod:`grpokit.rollout.multiturn`, whose Rollouts — ``loss_mask``, ``conversations``, Turn records
— this engine returns). A turn ends at the end-of-turn or an EOS token, or at the rollout's remaining budget (one
generate call runs to the largest budget of its rows; each row is cut to its own, as TRL truncates post-tool turns).
Each round's log-probs are the policy's: log softmax(logits / temperature) at the turn's tokens, from one forward pass
over the round's rows (what the learner computes).

A tool that returns images (with a vision-language model's processor: docs/vision.md, "Tools that return images"):
its round's suffix carries the images' placeholders and pixel inputs (:class:`grpokit.tools.ToolLoop`), the rows'
next generate call gets them as TRL passes them (pixel inputs of the call's rows concatenated, image-token type ids),
the log-prob forward too, and the Rollouts carry them per completion (``completion_pixels`` ...), as grpokit's own
multi-turn engine fills them. A prompt with images: every call and forward of its rows gets the prompt's pixel inputs
(``VisionPrompt.pixels``) before its tools' images, in the order of the row's image placeholders.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from grpokit.machine.hardware import autocast
from grpokit.models.vision_inputs import conversation_inputs
from grpokit.rollout.engine import left_pad
from grpokit.rollout.multiturn import MultiTurnEngine
from grpokit.rollout.transformers_engine import TransformersRolloutEngine
from grpokit.rollout.types import Rollouts, SamplingParams
from grpokit.rollout.vision_rows import prompt_pixels
from grpokit.tools.conversation import ConversationTokens
from grpokit.tools.environment import EnvironmentSession
from grpokit.tools.executor import ToolExecutor
from grpokit.tools.loop import ToolLoop, ToolRollout
from grpokit.tools.parsing import ToolParser


class TransformersMultiTurnEngine(MultiTurnEngine):
    """Tool rollouts over a :class:`TransformersRolloutEngine` (its model, pad and EOS ids, generation config,
    random stream and policy version), one ``generate`` call per round. ``on_generate``, when set, is called after
    each call with the indices of the rollouts it sampled."""

    def __init__(
        self,
        engine: TransformersRolloutEngine,
        chat: ConversationTokens,
        executor: ToolExecutor,
        *,
        max_tool_calling_iterations: int | None = None,
        parser: str | ToolParser | None = None,
    ):
        super().__init__(engine, chat, executor, max_tool_calling_iterations=max_tool_calling_iterations, parser=parser)
        self.on_generate = None

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[Sequence[Mapping[str, Any]]],
        num_generations: int,
        params: SamplingParams,
        sessions: Sequence[EnvironmentSession | None] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> Rollouts:
        """``num_generations`` conversations for each chat prompt, as :meth:`MultiTurnEngine.generate` returns them.
        ``seeds`` (one per prompt): the batch's generate calls draw from a stream seeded by all of them together
        (generate samples the rows of a call together, as in TRL), else from the engine's generator."""
        N = len(prompts) * num_generations
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts; pass one per prompt")
        params, loop, rollouts = self._start(prompts, num_generations, params, sessions)
        prompt_messages = [len(r.messages) for r in rollouts]
        stream = self.engine.generator if seeds is None else _stream(seeds)
        record: dict[str, dict[int, list]] = {"logprobs": {i: [] for i in range(N)}, "times": {i: [] for i in range(N)}}
        model = self.engine.model
        was_training = model.training
        model.eval()
        try:
            while True:
                active = [i for i, r in enumerate(rollouts) if r.state == "generating"]
                if not active:
                    break
                self._round(loop, rollouts, active, params, stream, record)
                while any(r.state == "tools" for r in rollouts):  # the round's calls, all of them, before the next
                    loop.poll(rollouts, wait=True)
        finally:
            model.train(was_training)
        return self._rollouts(rollouts, record, num_generations, prompt_messages)

    def _round(self, loop: ToolLoop, rollouts: list[ToolRollout], active: list[int], params, stream, record) -> None:
        """One generate call over the ``active`` rollouts' conversations so far; each gets its turn recorded."""
        engine = self.engine
        stops = sorted({self.chat.end_of_turn, *engine.eos_token_ids})
        budgets = [loop.remaining(rollouts[i]) for i in active]
        ids, mask = left_pad([rollouts[i].conversation.ids for i in active], engine.pad_token_id, engine.device)
        # each row's images in placeholder order: its prompt's pixel inputs (VisionPrompt.pixels), then its tools'
        images = [[prompt_pixels(rollouts[i]), *rollouts[i].conversation.pixels] for i in active]
        config = engine.generation_config(dataclasses.replace(params, max_completion_length=max(budgets)))
        config.eos_token_id = stops  # a turn ends at the chat's end of turn too
        seed = int(torch.randint(0, 2**62, (1,), generator=stream, device=stream.device))
        started = time.monotonic()
        with torch.random.fork_rng(devices=[]), autocast(engine.device, engine.autocast_dtype):
            torch.manual_seed(seed)  # generate draws from the global RNG: one seed per call, from this stream
            sequences = engine.model.generate(**self._generate_inputs(ids, mask, images), generation_config=config)
            turns = [_cut(row, stops, budget) for row, budget in zip(sequences[:, ids.size(1) :].tolist(), budgets)]
            width = max(max(len(t) for t in turns), 1)
            padded = torch.tensor([t + [engine.pad_token_id] * (width - len(t)) for t in turns], dtype=torch.long)
            logprobs = self._logprobs(ids, mask, padded, params.temperature, images).cpu()  # [A, width]
        ended = time.monotonic()
        if self.on_generate is not None:
            self.on_generate(list(active))
        for k, i in enumerate(active):
            record["logprobs"][i] += logprobs[k, : len(turns[k])].tolist()
            record["times"][i].append((started, ended))
            loop.turn_done(rollouts[i], turns[k])

    def _generate_inputs(self, ids: torch.Tensor, mask: torch.Tensor, images: list[list[dict]]) -> dict:
        """generate's inputs, as TRL passes them after a tool showed images: the left-padded ``input_ids`` and
        ``attention_mask``, the rows' image inputs concatenated in row order and the image-token type ids
        (``mm_token_type_ids`` / ``token_type_ids``, 1 on image placeholders); no positions (generate makes the
        model's own)."""
        if not any(p for row in images for p in row):
            return {"input_ids": ids, "attention_mask": mask}
        inputs = conversation_inputs(self.engine.model, ids, mask, images)
        inputs.pop("position_ids")
        return inputs

    def _logprobs(self, ids, mask, turns: torch.Tensor, temperature: float, images: list[list[dict]]):
        """[A, T] log softmax(logits / temperature) of the policy at each turn token: the engine's forward over
        conversation + turn, or for rows with images (the prompt's, the tools') one forward with their pixel inputs and
        the model's own positions over the whole sequence (images may lie anywhere in it)."""
        if not any(p for row in images for p in row):
            return self.engine._logprobs(ids, mask, turns, temperature)
        T = turns.size(1)
        full = torch.cat([ids, turns.to(ids.device)], dim=1)  # [A, L+T]
        full_mask = torch.cat([mask, torch.ones_like(turns, device=mask.device)], dim=1)  # [A, L+T]
        inputs = conversation_inputs(self.engine.model, full, full_mask, images)
        logits = self.engine.model(**inputs, logits_to_keep=T + 1).logits[:, :-1].float() / temperature  # [A, T, V]
        return torch.log_softmax(logits, dim=-1).gather(-1, turns.to(ids.device)[..., None]).squeeze(-1)


def _cut(row: list[int], stops: list[int], budget: int) -> list[int]:
    """A generated row's turn: up to and including its first stop token, at most ``budget`` tokens (what follows is
    padding or past the rollout's budget)."""
    for k, token in enumerate(row[:budget]):
        if token in stops:
            return row[: k + 1]
    return row[:budget]


def _stream(seeds: Sequence[int]) -> torch.Generator:
    """A random stream seeded by the batch's group seeds together."""
    value = 0
    for seed in seeds:
        value = (value * 1_000_003 + int(seed)) % 2**62
    return torch.Generator().manual_seed(value)
