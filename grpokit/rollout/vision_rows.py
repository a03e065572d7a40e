"""Multi-turn rows whose conversations hold images a tool returned (:class:`grpokit.rollout.multiturn.MultiTurnEngine`
with a processor): such a row cannot decode on a KV cache with one text position per token, since models with
multimodal rotary positions (Qwen2-VL's M-RoPE) jump positions after each image. :class:`VisionRows` decodes them by
a full forward pass over each row's whole conversation every step, with all its pixel inputs and the model's own
positions (:func:`grpokit.models.vision_inputs.conversation_inputs`); :class:`SplitRows` keeps the text-only rows on
the KV-cache batch and moves a row to :class:`VisionRows` when it gets its first tool image (docs/vision.md, "Tools
that return images": what it costs)."""

from __future__ import annotations

import torch

from grpokit.models.loading import logits_of
from grpokit.models.vision_inputs import conversation_inputs
from grpokit.rollout.multiturn_rows import PlainRows
from grpokit.tools.loop import ToolRollout


def shows_images(rollout: ToolRollout) -> bool:
    """Whether the rollout's conversation holds an image so far (its prompt's, or one a tool showed)."""
    return bool(rollout.conversation.pixels) or rollout.conversation.vision_prompt is not None


def prompt_pixels(rollout: ToolRollout) -> dict | None:
    """The pixel inputs of the rollout's prompt images (None: a text prompt)."""
    prompt = rollout.conversation.vision_prompt
    return None if prompt is None else prompt.pixels


class VisionRows(PlainRows):
    """The decoding batch of rows with tool images: :class:`PlainRows` (each step one forward pass over the rows'
    right-padded conversations) with their pixel inputs, the prompt's then the tools', and the model's positions."""

    def _forward(self) -> None:
        device = self.engine.device
        width = max(len(s) for s in self.seqs)
        ids = torch.full((len(self.seqs), width), self.engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(self.seqs), width), dtype=torch.long)
        for r, seq in enumerate(self.seqs):
            ids[r, : len(seq)], mask[r, : len(seq)] = torch.tensor(seq), 1
        images = [[prompt_pixels(self.rollouts[i]), *self.rollouts[i].conversation.pixels] for i in self.rows]
        inputs = conversation_inputs(self.engine.model, ids.to(device), mask.to(device), images)
        logits = logits_of(self.engine.model(**inputs, use_cache=False))  # [A, L, V]
        last = torch.tensor([len(s) - 1 for s in self.seqs], device=logits.device)
        self.logits = logits[torch.arange(len(self.seqs), device=logits.device), last]  # [A, V]


class SplitRows:
    """Two decoding batches as one: ``text`` (the KV-cache rows, or plain rows) for conversations without images,
    ``vision`` (:class:`VisionRows`) for those with (in the prompt or from a tool). A row joins the batch its
    conversation needs; its kept KV cache is dropped when it moves to ``vision``."""

    def __init__(self, text, vision: VisionRows, rollouts: list[ToolRollout]):
        self.text, self.vision, self.rollouts = text, vision, rollouts

    @property
    def rows(self) -> list[int]:
        return [*self.text.rows, *self.vision.rows]

    @property
    def logits(self) -> torch.Tensor | None:
        parts = [b.logits for b in (self.text, self.vision) if b.rows]
        return None if not parts else parts[0] if len(parts) == 1 else torch.cat(parts)

    def add(self, joining: list[int], budgets: list[int]) -> None:
        to_vision = [i for i in joining if shows_images(self.rollouts[i])]
        to_text = [i for i in joining if i not in set(to_vision)]
        for i in to_vision:
            getattr(self.text, "kept", {}).pop(i, None)
        # ``budgets`` covers the batch's rows then the joining ones; each part needs only its own rows' budget
        limit = max(budgets)
        if to_text:
            self.text.add(to_text, [limit] * (len(self.text.rows) + len(to_text)))
        if to_vision:
            self.vision.add(to_vision, [limit] * (len(self.vision.rows) + len(to_vision)))

    def remove(self, leaving: list[int], waiting: list[bool]) -> None:
        split = len(self.text.rows)
        text = [(r, w) for r, w in zip(leaving, waiting) if r < split]
        vision = [(r - split, w) for r, w in zip(leaving, waiting) if r >= split]
        if text:
            self.text.remove([r for r, _ in text], [w for _, w in text])
        if vision:
            self.vision.remove([r for r, _ in vision], [w for _, w in vision])

    def step(self, tokens: torch.Tensor) -> None:
        split = len(self.text.rows)
        if split:
            self.text.step(tokens[:split])
        if self.vision.rows:
            self.vision.step(tokens[split:])
